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
  ReportQueue queue(3, 1 << 20);
  for (int i = 0; i < 7; ++i) queue.Push(Event(i));
  auto first = queue.TakeBatch(milliseconds(10), milliseconds(0));
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].event_json(), "{\"i\":0}");
  EXPECT_EQ(first[2].event_json(), "{\"i\":2}");
  EXPECT_EQ(queue.size(), 4u);
}

TEST(ReportQueueTest, PutBackKeepsOrder) {
  ReportQueue queue(2, 1 << 20);
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
  ReportQueue queue(100, 10);
  v1::RankReport big;
  big.set_log(std::string(100, 'x'));
  queue.Push(big);
  queue.Push(big);
  EXPECT_EQ(queue.TakeBatch(milliseconds(10), milliseconds(0)).size(), 1u);
  EXPECT_EQ(queue.TakeBatch(milliseconds(10), milliseconds(0)).size(), 1u);
}

TEST(ReportQueueTest, EmptyAfterWaitOrClose) {
  ReportQueue queue(10, 1 << 20);
  EXPECT_TRUE(queue.TakeBatch(milliseconds(20), milliseconds(0)).empty());
  queue.Close();
  EXPECT_TRUE(queue.TakeBatch(std::chrono::hours(1), std::chrono::hours(1)).empty());
}

}  // namespace
}  // namespace hyscale::agent
