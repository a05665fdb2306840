// EventSink: the JSON lines the agent reads, and the terminal progress bar.
#include "worker/trainer/events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "proto/events.h"

namespace hyscale::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobSpec two_stage_spec() {
  v1::JobSpec spec;
  spec.set_name("demo");
  spec.set_log_every(2);
  v1::StageSpec* warmup = spec.add_stages();
  warmup->set_name("warmup");
  warmup->set_steps(3);
  warmup->set_attention(v1::DENSE);
  warmup->set_trains(v1::INDEXER_ONLY);
  v1::StageSpec* sparse = spec.add_stages();
  sparse->set_name("sparse");
  sparse->set_steps(2);
  sparse->set_attention(v1::SPARSE);
  sparse->set_trains(v1::ALL);
  return spec;
}

StepEvent metrics_at(int64_t step) {
  StepEvent m;
  m.set_step(step);
  m.set_stage(step > 3 ? 1 : 0);
  // Stage 0 trains the indexer alone: its steps report no LM loss.
  m.set_loss(step > 3 ? 2.5 : 0.5);
  if (step > 3) m.set_lm_loss(2.0);
  m.set_indexer_loss(0.5);
  m.set_lr(1e-3);
  m.set_step_seconds(0.25);
  m.set_tokens_per_second(4096);
  m.set_peak_memory_bytes(1 << 20);
  const std::map<std::string, double> phases = {
      {"data", 0.01}, {"selection_fwd", 0.05}, {"optimizer", 0.02}};
  m.mutable_phase_seconds()->insert(phases.begin(), phases.end());
  if (step == 5) {
    m.mutable_evaluation()->set_accuracy(0.75);
    m.mutable_evaluation()->set_indexer_recall(0.9);
    for (const auto& [group, ratio] : {std::pair{2, 1.03}, std::pair{64, 4.06}}) {
      auto* shared = m.mutable_evaluation()->add_key_sharing();
      shared->set_group(group);
      shared->set_selected_per_distinct(ratio);
    }
  }
  return m;
}

// Runs the demo job through `sink`.
void run_job(EventSink& sink, const absl::Status& outcome) {
  const v1::JobSpec spec = two_stage_spec();
  sink.JobStarted(spec, "cuda:0 NVIDIA H200 pci 00000000:1A:00.0");
  sink.StageStarted(0, spec.stages(0), 1);
  for (int64_t step = 1; step <= 5; ++step) {
    if (step == 4) {
      sink.StageFinished(0, spec.stages(0), 3);
      sink.StageStarted(1, spec.stages(1), 4);
    }
    sink.Step(metrics_at(step), 5);
  }
  sink.StageFinished(1, spec.stages(1), 5);
  sink.CheckpointWritten(5, "/ckpt/step-00000005");
  sink.Warning("disk almost full");
  sink.JobFinished(outcome);
}

// Every line as the agent and the coordinator read it.
std::vector<v1::TrainerEventLine> parse_lines(const std::string& text) {
  std::vector<v1::TrainerEventLine> events;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    auto event = ParseEventLine(line);
    EXPECT_TRUE(event.ok()) << line << ": " << event.status();
    if (event.ok()) events.push_back(*std::move(event));
  }
  return events;
}

TEST(EventSink, WritesOneJsonLinePerEvent) {
  std::ostringstream out;
  EventSink sink({&out}, nullptr);
  run_job(sink, absl::OkStatus());

  const auto events = parse_lines(out.str());
  std::vector<std::string> names;
  for (const auto& e : events) {
    names.emplace_back(EventKind(e));
    EXPECT_GT(e.time(), 0) << e.ShortDebugString();
  }
  // Steps: the first, every log_every (2), and the last (with its evaluation); not 3.
  EXPECT_THAT(names, ElementsAre("job_started", "stage_started", "step", "step", "stage_finished",
                                 "stage_started", "step", "step", "stage_finished",
                                 "checkpoint_written", "warning", "job_finished"));
  EXPECT_EQ(events[0].job_started().total_steps(), 5);
  EXPECT_EQ(events[0].job_started().name(), "demo");
  EXPECT_EQ(events[0].job_started().device(), "cuda:0 NVIDIA H200 pci 00000000:1A:00.0");
  EXPECT_EQ(events[1].stage_started().attention(), v1::DENSE);
  EXPECT_EQ(events[1].stage_started().trains(), v1::INDEXER_ONLY);
  EXPECT_EQ(events[5].stage_started().stage(), 1);
  EXPECT_EQ(events[5].stage_started().step(), 4);

  const auto& step2 = events[3].step();
  EXPECT_EQ(step2.step(), 2);
  EXPECT_EQ(step2.total_steps(), 5);
  EXPECT_EQ(step2.stage(), 0);
  EXPECT_DOUBLE_EQ(step2.loss(), 0.5);
  EXPECT_FALSE(step2.has_lm_loss());
  EXPECT_DOUBLE_EQ(step2.indexer_loss(), 0.5);
  EXPECT_DOUBLE_EQ(events[6].step().lm_loss(), 2.0);
  EXPECT_DOUBLE_EQ(step2.lr(), 1e-3);
  EXPECT_DOUBLE_EQ(step2.tokens_per_second(), 4096);
  EXPECT_EQ(step2.peak_memory_bytes(), 1 << 20);
  EXPECT_DOUBLE_EQ(step2.phase_seconds().at("selection_fwd"), 0.05);
  EXPECT_GE(step2.eta_seconds(), 0);
  EXPECT_FALSE(step2.has_evaluation());

  const auto& last = events[7].step();
  EXPECT_EQ(last.step(), 5);
  EXPECT_DOUBLE_EQ(last.evaluation().accuracy(), 0.75);
  EXPECT_DOUBLE_EQ(last.evaluation().indexer_recall(), 0.9);
  EXPECT_DOUBLE_EQ(last.eta_seconds(), 0);

  EXPECT_EQ(events[9].checkpoint_written().path(), "/ckpt/step-00000005");
  EXPECT_EQ(events[10].warning(), "disk almost full");
  EXPECT_TRUE(events[11].job_finished().ok());
  EXPECT_EQ(events[11].job_finished().reason(), "");
}

TEST(EventSink, FailureCarriesTheReason) {
  std::ostringstream out;
  EventSink sink({&out}, nullptr);
  sink.JobFinished(absl::InternalError("loss is not finite at step 7"));
  const auto events = parse_lines(out.str());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].job_finished().ok());
  EXPECT_EQ(events[0].job_finished().reason(), "loss is not finite at step 7");
}

TEST(EventSink, WritesToEveryJsonStream) {
  std::ostringstream a, b;
  EventSink sink({&a, &b}, nullptr);
  sink.Warning("w");
  EXPECT_EQ(a.str(), b.str());
  EXPECT_THAT(a.str(), HasSubstr("\"warning\""));
}

TEST(EventSink, TerminalShowsABarAndReadableLines) {
  std::ostringstream terminal;
  EventSink sink({}, &terminal);
  run_job(sink, absl::OkStatus());
  const std::string text = terminal.str();
  EXPECT_THAT(text, HasSubstr("\r"));
  EXPECT_THAT(text, HasSubstr("] 5/5 100%  ETA 0:00:00  loss 2.5000  4096 tok/s"));
  EXPECT_THAT(text, HasSubstr("step 2/5  loss 0.5000 (indexer 0.5000)  lr 1.00e-03"));
  EXPECT_THAT(text, HasSubstr("step 4/5  loss 2.5000 (lm 2.0000, indexer 0.5000)  lr 1.00e-03"));
  EXPECT_THAT(text,
              HasSubstr("accuracy 0.750  indexer recall 0.900  keys shared G2/64 1.03/4.06x"));
  EXPECT_THAT(text, HasSubstr("warning: disk almost full\n"));
  EXPECT_THAT(text, HasSubstr("done in 0:00:00\n"));
  EXPECT_EQ(text.back(), '\n');                  // the bar is gone once the job is over
  EXPECT_EQ(text.find('{'), std::string::npos);  // no JSON on the terminal
}

}  // namespace
}  // namespace hyscale::trainer
