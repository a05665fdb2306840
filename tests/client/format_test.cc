#include "client/format.h"

#include <gtest/gtest.h>

#include <sstream>

#include "client/exit_codes.h"

namespace hyscale::cli {
namespace {

TEST(FormatTest, TableAlignsColumns) {
  Table table({"ID", "NAME", "STATE"});
  table.AddRow({"job-1", "a-long-name", "RUNNING"});
  table.AddRow({"job-22", "b", ""});
  std::ostringstream out;
  table.Print(out);
  EXPECT_EQ(out.str(),
            "ID      NAME         STATE\n"
            "job-1   a-long-name  RUNNING\n"
            "job-22  b\n");
}

// Names and reasons come from other users and from trainers: no terminal control gets through.
TEST(FormatTest, PrintableEscapesControlCharacters) {
  EXPECT_EQ(Printable("plain caf\xc3\xa9"), "plain caf\xc3\xa9");
  EXPECT_EQ(Printable("a\x1b[2Jb\nc\x7f"), "a\\x1b[2Jb\\x0ac\\x7f");
  EXPECT_EQ(Printable("csi \xc2\x9b"), "csi \\xc2\\x9b");
  Table table({"NAME"});
  table.AddRow({"evil\x1b]0;title\x07"});
  std::ostringstream out;
  table.Print(out);
  EXPECT_EQ(out.str(), "NAME\nevil\\x1b]0;title\\x07\n");
}

TEST(FormatTest, States) {
  EXPECT_EQ(StateName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(*ParseState("running"), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*ParseState("JOB_STATE_FAILED"), v1::JOB_STATE_FAILED);
  EXPECT_EQ(*ParseState("Cancelled"), v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(ParseState("unspecified").ok());
  auto bad = ParseState("done");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--state"), std::string::npos);
  EXPECT_EQ(*ParseDeviceKind("GPU"), v1::DEVICE_KIND_GPU);
  EXPECT_FALSE(ParseDeviceKind("tpu").ok());
}

TEST(FormatTest, Numbers) {
  EXPECT_EQ(FormatDuration(83), "0:01:23");
  EXPECT_EQ(FormatDuration(43200), "12:00:00");
  EXPECT_EQ(FormatDuration(-1), "-");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(int64_t{141} << 30), "141.0 GiB");
  EXPECT_EQ(FormatRate(950), "950");
  EXPECT_EQ(FormatRate(12345), "12.3k");
  EXPECT_EQ(FormatRate(2.5e6), "2.5M");
  google::protobuf::Timestamp time;
  EXPECT_EQ(FormatAge(time, 1000), "-");
  time.set_seconds(1000);
  EXPECT_EQ(FormatAge(time, 1042), "42s");
  EXPECT_EQ(FormatAge(time, 1000 + 300), "5m");
  EXPECT_EQ(FormatAge(time, 1000 + 3 * 3600), "3h");
  EXPECT_EQ(FormatTimestamp(time), "1970-01-01T00:16:40Z");
}

TEST(FormatTest, ProgressBar) {
  v1::TrainerEventLine::Step step;
  step.set_step(250);
  step.set_total_steps(1000);
  step.set_eta_seconds(83);
  step.set_loss(2.34567);
  step.set_tokens_per_second(12345);
  EXPECT_EQ(ProgressBar(step, 20),
            "[#####...............] 250/1000   25%  ETA 0:01:23  loss 2.3457  12.3k tok/s");
  step.mutable_evaluation()->set_accuracy(0.5);
  step.mutable_evaluation()->set_indexer_recall(0.25);
  EXPECT_NE(ProgressBar(step, 20).find("acc 0.500  recall 0.250"), std::string::npos);
  step.set_total_steps(0);
  EXPECT_EQ(ProgressBar(step, 4).substr(0, 6), "[....]");
}

TEST(FormatTest, PhaseBreakdownIsFullWidthBiggestFirst) {
  const std::string line = PhaseBreakdown(
      {{"data", 1.0}, {"selection", 4.0}, {"attention_fwd", 3.0}, {"other", 2.0}}, 10);
  EXPECT_EQ(line,
            "phases [####===++-]  # selection 40%  = attention_fwd 30%  + other 20%  - data 10%");
  EXPECT_EQ(PhaseBreakdown({}, 10), "phases -");
  const std::string uneven = PhaseBreakdown({{"a", 1}, {"b", 1}, {"c", 1}}, 10);
  EXPECT_EQ(uneven.substr(0, 19), "phases [###===++++]");
  // Past ten phases the smallest share the last symbol, as "rest".
  std::map<std::string, double> many;
  for (int i = 0; i < 12; ++i) many["p" + std::to_string(10 + i)] = 1.0 + i;
  const std::string folded = PhaseBreakdown(many, 78);
  EXPECT_NE(folded.find("  % p13 "), std::string::npos) << folded;
  EXPECT_NE(folded.find("  @ rest 8%"), std::string::npos) << folded;
  EXPECT_EQ(folded.find("p12"), std::string::npos) << folded;
}

TEST(FormatTest, EventLines) {
  v1::JobEvent event;
  event.mutable_time()->set_seconds(3600 + 120 + 3);
  auto* change = event.mutable_state_change();
  change->set_from(v1::JOB_STATE_RUNNING);
  change->set_to(v1::JOB_STATE_RESTARTING);
  change->set_reason("worker lost");
  change->set_restarts(1);
  EXPECT_EQ(DescribeEvent(event), "01:02:03 state RUNNING -> RESTARTING (restart 1): worker lost");
  change->set_from(v1::JOB_STATE_RESTARTING);
  change->set_restarts(0);
  EXPECT_EQ(DescribeEvent(event), "01:02:03 state RESTARTING: worker lost");

  v1::JobEvent replanned = event;
  v1::JobReplanned& plan = *replanned.mutable_replanned();
  plan.set_reason("planned again for the online workers' devices (70.8 GiB usable)");
  plan.mutable_parallelism()->set_context_parallel(1);
  plan.mutable_parallelism()->set_query_group(1);
  plan.mutable_recompute()->set_enabled(true);
  plan.mutable_recompute()->set_selection_replay(true);
  plan.set_memory_bytes_per_rank(int64_t{30} << 30);
  EXPECT_EQ(DescribeEvent(replanned),
            "01:02:03 re-planned: planned again for the online workers' devices (70.8 GiB "
            "usable); now CP 1, G 1, recomputation with replay, 30.0 GiB a rank");

  v1::JobEvent trainer;
  trainer.mutable_trainer()->set_rank(1);
  v1::TrainerEventLine& line = *trainer.mutable_trainer()->mutable_event();
  line.mutable_checkpoint_written()->set_step(50);
  line.mutable_checkpoint_written()->set_path("/c/50");
  EXPECT_EQ(DescribeEvent(trainer), "--:--:-- rank 1 checkpoint_written: step 50 /c/50");
  line.mutable_job_finished()->set_reason("loss is not finite\x1b[2J");
  EXPECT_EQ(DescribeEvent(trainer),
            "--:--:-- rank 1 job_finished: failed: loss is not finite\\x1b[2J");
  line.set_warning("disk almost full");
  EXPECT_EQ(DescribeEvent(trainer), "--:--:-- rank 1 warning: disk almost full");
  line.mutable_stage_started()->set_name("sparse");
  line.mutable_stage_started()->set_steps(100);
  line.mutable_stage_started()->set_attention(v1::SPARSE);
  line.mutable_stage_started()->set_trains(v1::ALL);
  EXPECT_EQ(DescribeEvent(trainer),
            "--:--:-- rank 1 stage_started: 0 (sparse): 100 steps, SPARSE attention, trains ALL");
  line.mutable_stage_started()->set_query_chunk(8192);
  line.mutable_stage_started()->mutable_predicted_memory()->set_total_bytes(int64_t{3} << 30);
  EXPECT_EQ(DescribeEvent(trainer),
            "--:--:-- rank 1 stage_started: 0 (sparse): 100 steps, SPARSE attention, trains ALL, "
            "queries in chunks of 8192, predicted peak 3.0 GiB");
  // An event stored before the trainer's lines were typed has no kind.
  line.Clear();
  EXPECT_EQ(DescribeEvent(trainer), "--:--:-- rank 1 event of an unknown kind");

  v1::JobEvent step;
  auto* figures = step.mutable_trainer()->mutable_event()->mutable_step();
  figures->set_step(10);
  figures->set_total_steps(20);
  figures->set_loss(1.5);
  EXPECT_NE(DescribeEvent(step).find("rank 0 step 10/20 stage 0  loss 1.5000"), std::string::npos);
  // An evaluation shows the key sharing of G = 16, the kernels' largest query group.
  auto* evaluation = figures->mutable_evaluation();
  evaluation->set_indexer_recall(0.5);
  for (const int group : {2, 16}) {
    auto* shared = evaluation->add_key_sharing();
    shared->set_group(group);
    shared->set_selected_per_distinct(group == 16 ? 3.42 : 1.2);
  }
  EXPECT_NE(DescribeEvent(step).find("indexer recall 0.500  keys shared by 16 queries 3.42x"),
            std::string::npos);
  EXPECT_EQ(DescribeEvent(step).find("1.20x"), std::string::npos);
}

TEST(ExitCodeTest, Mapping) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), 3);
  EXPECT_EQ(ExitCodeFor(absl::UnauthenticatedError("x")), 4);
  EXPECT_EQ(ExitCodeFor(absl::PermissionDeniedError("x")), 4);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x")), 5);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x")), 5);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("x")), 6);
  EXPECT_EQ(ExitCodeFor(absl::AlreadyExistsError("x")), 6);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), 7);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::NOT_FOUND, "x")), 3);
}

}  // namespace
}  // namespace hyscale::cli
