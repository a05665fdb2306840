// hyscale-train as a real process: checkpoint -> resume continues bit-identically; a corrupt
// newest checkpoint falls back to the previous one; bad job specs and data files fail with a
// message naming the field or file and exit code 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "util/subprocess.h"
#include "util/temp_dir.h"

#include "proto/events.h"

namespace {

using hyscale::ParseEventLine;

namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// These cases train small CPU models, whose shapes the CUDA kernels need not take: on a machine
// with a GPU, --device auto would pick it.
Result run(std::vector<std::string> args,
           std::vector<std::pair<std::string, std::string>> env = {}) {
  if (std::find(args.begin(), args.end(), "--device") == args.end()) {
    args.insert(args.end(), {"--device", "cpu"});
  }
  args.insert(args.begin(), HYSCALE_TRAIN_BINARY);
  hyscale::util::Command command(std::move(args));
  command.env = std::move(env);
  command.stderr_to = hyscale::util::Redirect::ToStdout();
  const auto ran = hyscale::util::RunAndCapture(std::move(command));
  if (!ran.ok()) return {-1, ran.status().ToString()};
  return {ran->exit.signal == 0 ? ran->exit.exit_code : -1, ran->output};
}

class TrainCliTest : public ::testing::Test {
 protected:
  // A tiny two-stage job (dense, then sparse with recomputation and replay).
  static nlohmann::json base_spec() {
    return nlohmann::json::parse(R"({
      "name": "tiny", "seed": 3,
      "model": {"vocab_size": 64, "d_model": 32, "layers": 2, "heads": 2, "head_dim_qk": 16,
                "rope_dim": 8, "head_dim_v": 16, "d_ff": 64,
                "indexer": {"heads": 2, "dim": 16, "rope_dim": 8, "topk": 8}},
      "data": {"seq_len": 96, "batch_size": 2,
               "recall": {"pairs": 8, "queries": 4, "key_vocab": 16, "value_vocab": 16}},
      "stages": [
        {"name": "dense", "steps": 4, "lr": 1e-3, "warmup_steps": 1, "attention": "DENSE",
         "indexer_loss_weight": 1.0},
        {"name": "sparse", "steps": 4, "lr": 1e-3, "attention": "SPARSE",
         "indexer_loss_weight": 1.0}],
      "recompute": {"enabled": true, "selection_replay": true},
      "optimizer": {"weight_decay": 0.1, "grad_clip": 1.0},
      "checkpoint": {"every_steps": 2, "keep": 5},
      "log_every": 1, "threads": 1})");
  }

  std::string write_spec(const nlohmann::json& spec) {
    const std::string path = dir_.Path("job.json");
    std::ofstream(path) << spec.dump(2);
    return path;
  }

  // The JSON-line events a run printed, in order.
  static std::vector<hyscale::v1::TrainerEventLine> events(const std::string& output) {
    std::vector<hyscale::v1::TrainerEventLine> out;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) {
      auto event = ParseEventLine(line);
      if (event.ok()) out.push_back(*std::move(event));
    }
    return out;
  }

  // step -> loss, as printed in the JSON-line events.
  static std::map<int64_t, double> losses(const std::string& output) {
    std::map<int64_t, double> out;
    for (const auto& event : events(output)) {
      if (event.has_step()) out[event.step().step()] = event.step().loss();
    }
    return out;
  }

  const hyscale::util::TempDir dir_ = hyscale::util::TempDir::Create("hyscale-train-test").value();
};

TEST_F(TrainCliTest, ResumeContinuesBitIdentically) {
  const std::string spec = write_spec(base_spec());
  const std::string ckpt = dir_.Path("ckpt");
  const Result full = run({"--config", spec, "--checkpoint-dir", ckpt});
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto expected = losses(full.output);
  ASSERT_EQ(expected.size(), 8u) << full.output;

  // Drop the newest checkpoints so the run resumes from step 4, in the dense stage, then
  // recomputes steps 5..8 (the sparse stage with replay): every loss must be bit-identical.
  for (const char* step : {"step-00000006", "step-00000008"}) fs::remove_all(fs::path(ckpt) / step);
  const Result resumed = run({"--config", spec, "--checkpoint-dir", ckpt, "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("checkpoint_loaded"), std::string::npos) << resumed.output;
  const auto after = losses(resumed.output);
  ASSERT_EQ(after.size(), 4u) << resumed.output;
  for (const auto& [step, loss] : after) {
    EXPECT_EQ(loss, expected.at(step)) << "step " << step << " differs after resume";
  }
}

// --query-chunk: every stage runs its queries 40 at a time (96 tokens: chunks of 40, 40, 16),
// says so in its stage_started event, and trains as the whole sequence does (float32, CPU: the
// sums run in another order, so the losses agree to rounding).
TEST_F(TrainCliTest, QueryChunksTrainLikeWholeSequences) {
  const std::string spec = write_spec(base_spec());
  const Result whole = run({"--config", spec, "--eval", "false"});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const Result chunked = run({"--config", spec, "--eval", "false", "--query-chunk", "40"});
  ASSERT_EQ(chunked.exit_code, 0) << chunked.output;
  int stages = 0;
  std::istringstream lines(chunked.output);
  for (std::string line; std::getline(lines, line);) {
    const auto event = ParseEventLine(line);
    if (event.ok() && event->has_stage_started()) {
      EXPECT_EQ(event->stage_started().query_chunk(), 40) << line;
      // The planner's memory model for the stage's shape and chunk.
      EXPECT_GT(event->stage_started().predicted_memory().total_bytes(), 0) << line;
      ++stages;
    }
  }
  EXPECT_EQ(stages, 2) << chunked.output;
  const auto want = losses(whole.output), got = losses(chunked.output);
  ASSERT_EQ(got.size(), want.size()) << chunked.output;
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got.at(step), loss, 1e-4 * std::abs(loss)) << "step " << step;
  }
  const Result bad = run({"--config", spec, "--query-chunk", "-3"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("recompute.query_chunk: must be >= 0 (got -3)"), std::string::npos)
      << bad.output;
}

// --skip-stage: the job trains without the named stage (an ablation's control), and a name no
// stage has is refused before training, with the stages it has.
TEST_F(TrainCliTest, SkipStageTrainsWithoutIt) {
  const std::string spec = write_spec(base_spec());
  const Result skipped = run({"--config", spec, "--eval", "false", "--skip-stage", "dense"});
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  std::vector<std::string> started;
  std::istringstream lines(skipped.output);
  for (std::string line; std::getline(lines, line);) {
    const auto event = ParseEventLine(line);
    if (event.ok() && event->has_stage_started()) started.push_back(event->stage_started().name());
  }
  EXPECT_EQ(started, std::vector<std::string>{"sparse"}) << skipped.output;
  EXPECT_EQ(losses(skipped.output).size(), 4u) << skipped.output;

  const Result unknown = run({"--config", spec, "--skip-stage", "warmup"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find(
                "--skip-stage warmup: the spec has no stage of that name (dense, sparse)"),
            std::string::npos)
      << unknown.output;
  const Result none_left =
      run({"--config", spec, "--skip-stage", "dense", "--skip-stage", "sparse"});
  EXPECT_EQ(none_left.exit_code, 2) << none_left.output;
  EXPECT_NE(none_left.output.find("stages"), std::string::npos) << none_left.output;
}

// --indexer-loss false: every stage trains without the indexer's loss (its share of a step is the
// difference: bench/train_bench.py --loss-share), so the steps report none; a stage that trains the
// indexer alone would learn nothing, and is refused before training, by name.
TEST_F(TrainCliTest, IndexerLossFalseTrainsWithoutTheLoss) {
  const std::string spec = write_spec(base_spec());
  const Result without = run({"--config", spec, "--eval", "false", "--indexer-loss", "false"});
  ASSERT_EQ(without.exit_code, 0) << without.output;
  int steps = 0;
  for (const auto& event : events(without.output)) {
    if (!event.has_step()) continue;
    ++steps;
    EXPECT_EQ(event.step().indexer_loss(), 0.0) << event.step().step();
    EXPECT_GT(event.step().lm_loss(), 0.0) << event.step().step();
  }
  EXPECT_EQ(steps, 8) << without.output;

  auto frozen = base_spec();
  frozen["stages"][0]["trains"] = "INDEXER_ONLY";
  const Result refused = run({"--config", write_spec(frozen), "--indexer-loss", "false"});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--indexer-loss false: stage 'dense' trains the indexer alone"),
            std::string::npos)
      << refused.output;
}

TEST_F(TrainCliTest, CorruptNewestCheckpointFallsBackWithAWarning) {
  const std::string spec = write_spec(base_spec());
  const std::string ckpt = dir_.Path("ckpt");
  const Result full = run({"--config", spec, "--checkpoint-dir", ckpt});
  ASSERT_EQ(full.exit_code, 0) << full.output;
  std::ofstream(fs::path(ckpt) / "step-00000008" / "model.safetensors", std::ios::binary)
      << "garbage";
  const Result resumed = run({"--config", spec, "--checkpoint-dir", ckpt, "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("warning"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step-00000008"), std::string::npos) << resumed.output;
  const auto after = losses(resumed.output);
  ASSERT_EQ(after.size(), 2u) << resumed.output;  // steps 7 and 8 again, from step 6
  EXPECT_EQ(after.begin()->first, 7);
  EXPECT_EQ(after.at(8), losses(full.output).at(8));
}

// A trainer of an earlier attempt (one a lost agent left running) writes nothing into a folder a
// later attempt has claimed: it stops at once, and the later attempt's checkpoints stand.
TEST_F(TrainCliTest, EarlierAttemptCannotWriteALaterOnesCheckpoints) {
  const std::string spec = write_spec(base_spec());
  const std::string ckpt = dir_.Path("ckpt");
  const Result later =
      run({"--config", spec, "--checkpoint-dir", ckpt}, {{"HYSCALE_ATTEMPT", "1"}});
  ASSERT_EQ(later.exit_code, 0) << later.output;
  const Result stale =
      run({"--config", spec, "--checkpoint-dir", ckpt, "--resume"}, {{"HYSCALE_ATTEMPT", "0"}});
  EXPECT_EQ(stale.exit_code, 1) << stale.output;
  EXPECT_NE(stale.output.find("attempt 1 of this job has taken the checkpoints over"),
            std::string::npos)
      << stale.output;
  EXPECT_TRUE(losses(stale.output).empty()) << stale.output;
  const auto manifest = nlohmann::json::parse(
      std::ifstream(fs::path(ckpt) / "step-00000008" / "manifest.json"), nullptr, false);
  EXPECT_EQ(manifest["attempt"], 1);
  const Result bad = run({"--config", spec, "--checkpoint-dir", ckpt}, {{"HYSCALE_ATTEMPT", "x"}});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("HYSCALE_ATTEMPT"), std::string::npos) << bad.output;
}

TEST_F(TrainCliTest, BadSpecsFailNamingTheField) {
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases = {
      {"model.d_model", [](auto& j) { j["model"]["d_model"] = 0; }},
      {"bogus_field", [](auto& j) { j["bogus_field"] = 1; }},
      {"model.indexer.topk", [](auto& j) { j["model"]["indexer"]["topk"] = 4096; }},
      {"stages[1].steps", [](auto& j) { j["stages"][1]["steps"] = -1; }},
      {"model.heads", [](auto& j) { j["model"]["heads"] = -2; }},
  };
  for (const auto& [field, mutate] : cases) {
    auto spec = base_spec();
    mutate(spec);
    const Result r = run({"--config", write_spec(spec)});
    EXPECT_EQ(r.exit_code, 2) << field << ": " << r.output;
    EXPECT_NE(r.output.find(field), std::string::npos) << field << ": " << r.output;
  }
}

TEST_F(TrainCliTest, MissingDataFileFailsNamingTheFile) {
  const std::string missing = dir_.Path("no-such-tokens.bin");
  auto spec = base_spec();
  spec["data"] = {
      {"seq_len", 32}, {"batch_size", 2}, {"token_file", {{"path", missing}, {"dtype", "UINT16"}}}};
  spec.erase("checkpoint");
  const Result r = run({"--config", write_spec(spec)});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(missing), std::string::npos) << r.output;
}

TEST_F(TrainCliTest, MissingConfigFailsNamingTheFile) {
  const Result r = run({"--config", "/nonexistent/job.yaml"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/job.yaml"), std::string::npos) << r.output;
}

}  // namespace
