#include "worker/agent/report_queue.h"

#include <gtest/gtest.h>

namespace hyscale::agent {
namespace {

using std::chrono::milliseconds;

v1::RankReport Event(int i) {
  v1::RankReport report;
  report.set_event_json("{\"i\":" + std::to_string(i) + "}");
  return report;
}

TEST(ReportQueueTest, BatchesInOrderWithinLimits) {
  ReportQueue queue(3, 1 << 20, 1 << 20);
  for (int i = 0; i < 7; ++i) queue.Push(Event(i));
  auto first = queue.TakeBatch(milliseconds(10), milliseconds(0));
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].event_json(), "{\"i\":0}");
  EXPECT_EQ(first[2].event_json(), "{\"i\":2}");
  EXPECT_EQ(queue.size(), 4u);
}

TEST(ReportQueueTest, PutBackKeepsOrder) {
  ReportQueue queue(2, 1 << 20, 1 << 20);
  for (int i = 0; i < 4; ++i) queue.Push(Event(i));
  auto batch = queue.TakeBatch(milliseconds(10), milliseconds(0));
  queue.Push(Event(4));
  queue.PutBack(std::move(batch));
  std::vector<std::string> order;
  while (queue.size() > 0) {
    for (const auto& report : queue.TakeBatch(milliseconds(10), milliseconds(0))) {
      order.push_back(report.event_json());
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"{\"i\":0}", "{\"i\":1}", "{\"i\":2}", "{\"i\":3}",
                                             "{\"i\":4}"}));
}

TEST(ReportQueueTest, ByteLimitSplitsButNeverStarves) {
  ReportQueue queue(100, 10, 1 << 20);
  v1::RankReport big;
  big.set_log(std::string(100, 'x'));
  queue.Push(big);
  queue.Push(big);
  EXPECT_EQ(queue.TakeBatch(milliseconds(10), milliseconds(0)).size(), 1u);
  EXPECT_EQ(queue.TakeBatch(milliseconds(10), milliseconds(0)).size(), 1u);
}

TEST(ReportQueueTest, EmptyAfterWaitOrClose) {
  ReportQueue queue(10, 1 << 20, 1 << 20);
  EXPECT_TRUE(queue.TakeBatch(milliseconds(20), milliseconds(0)).empty());
  queue.Close();
  EXPECT_TRUE(queue.TakeBatch(std::chrono::hours(1), std::chrono::hours(1)).empty());
}

TEST(ReportQueueTest, FullQueueDropsLogsThenEventsButKeepsExits) {
  ReportQueue queue(100, 1 << 20, 1000);
  v1::RankReport log;
  log.set_log(std::string(400, 'x'));
  v1::RankReport event;
  event.set_event_json(std::string(400, 'e'));
  v1::RankReport exited;
  exited.mutable_exited()->set_exit_code(1);
  for (int i = 0; i < 4; ++i) queue.Push(log);     // two fit, two dropped
  for (int i = 0; i < 4; ++i) queue.Push(event);   // up to twice the bound: two more fit
  for (int i = 0; i < 4; ++i) queue.Push(exited);  // always kept
  EXPECT_EQ(queue.dropped(), 4u);
  EXPECT_EQ(queue.size(), 8u);
  // Taking reports frees room again.
  auto batch = queue.TakeBatch(milliseconds(10), milliseconds(0));
  EXPECT_EQ(batch.size(), 8u);
  queue.Push(log);
  EXPECT_EQ(queue.size(), 1u);
  // A batch put back counts again.
  queue.PutBack(std::move(batch));
  queue.Push(log);
  EXPECT_EQ(queue.dropped(), 5u);
}

}  // namespace
}  // namespace hyscale::agent
