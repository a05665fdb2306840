#include "client/watch_view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace hyscale::cli {
namespace {

v1::JobEvent Step(int rank, int64_t step) {
  v1::JobEvent event;
  event.mutable_trainer()->set_rank(rank);
  auto* figures = event.mutable_trainer()->mutable_event()->mutable_step();
  figures->set_step(step);
  figures->set_total_steps(10);
  (*figures->mutable_phase_seconds())["selection_fwd"] = 1.0;
  return event;
}

v1::JobEvent State(v1::JobState from, v1::JobState to) {
  v1::JobEvent event;
  event.mutable_state_change()->set_from(from);
  event.mutable_state_change()->set_to(to);
  return event;
}

TEST(WatchViewTest, TerminalRedrawsBarBelowEventLines) {
  std::ostringstream out, err;
  Context context;
  context.out = &out;
  context.err = &err;
  context.terminal = true;
  WatchView view(context);
  view.Show(Step(0, 5));
  view.Show(Step(1, 9));  // another rank: the bar follows rank 0
  view.Show(State(v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED));
  view.Finish();
  const std::string text = out.str();
  // Two bar lines (progress, phases), cleared line by line before each redraw.
  EXPECT_NE(text.find("] 5/10"), std::string::npos) << text;
  EXPECT_EQ(text.find("] 9/10"), std::string::npos) << text;
  EXPECT_NE(text.find("phases ["), std::string::npos);
  EXPECT_NE(text.find("\r\033[K\033[1A\r\033[K"), std::string::npos);
  // The state line is printed above the redrawn bar, which stays at the end.
  const auto state = text.find("state RUNNING -> SUCCEEDED\n");
  ASSERT_NE(state, std::string::npos);
  EXPECT_NE(text.find("] 5/10", state), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST(WatchViewTest, PlainAndJsonLines) {
  std::ostringstream out, err;
  Context context;
  context.out = &out;
  context.err = &err;
  WatchView plain(context);
  plain.Show(Step(0, 5));
  plain.Show(State(v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED));
  EXPECT_EQ(out.str().find('\033'), std::string::npos);
  EXPECT_NE(out.str().find("rank 0 step 5/10"), std::string::npos);
  EXPECT_NE(out.str().find("state RUNNING -> FAILED\n"), std::string::npos);

  out.str("");
  context.output = OutputFormat::kJson;
  WatchView json(context);
  json.Show(Step(0, 5));
  const std::string line = out.str();
  EXPECT_EQ(line.rfind("{\"job_id\"", 0), 0u) << line;
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
}

}  // namespace
}  // namespace hyscale::cli
