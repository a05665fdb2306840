// hyscale-calibrate as a user runs it: its --quick file must be one the planner loads, replacing
// the figures it names; bad flags exit 2 naming the flag; `hyscale plan --calibration` takes it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "planner/profile.h"
#include "tests/client/tiny_spec.h"
#include "util/subprocess.h"
#include "util/temp_dir.h"

namespace hyscale::calibrate {
namespace {

namespace planner = server::planner;

struct Result {
  int code = -1;
  std::string output;  // stdout and stderr
};

Result RunCommand(const std::string& binary, const std::vector<std::string>& args) {
  util::Command command({binary});
  command.argv.insert(command.argv.end(), args.begin(), args.end());
  command.stderr_to = util::Redirect::ToStdout();
  const auto run = util::RunAndCapture(std::move(command));
  if (!run.ok()) return {-1, run.status().ToString()};
  return {run->exit.signal == 0 ? run->exit.exit_code : -1, run->output};
}

Result Calibrate(const std::vector<std::string>& args) {
  return RunCommand(HYSCALE_CALIBRATE_BIN, args);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class CalibrateTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.Path(name); }

  const util::TempDir dir_ = util::TempDir::Create("hyscale_calibrate_test").value();
};

constexpr const char* kFigures[] = {"dense_tflops",
                                    "hbm_gbps",
                                    "flash_topk_tflops",
                                    "flash_topk_fp8_tflops",
                                    "table_topk_tflops",
                                    "gather_fwd_tflops",
                                    "gather_bwd_tflops",
                                    "indexer_mass_tflops",
                                    "latent_fwd_tflops",
                                    "latent_bwd_tflops",
                                    "index_score_bwd_tflops",
                                    "kernel_launch_s",
                                    "latent_mass_tflops",
                                    "dense_indexer_loss_tflops",
                                    "optimizer_bytes_per_parameter"};

double Figure(const planner::DeviceProfile& p, const std::string& name) {
  if (name == "dense_tflops") return p.dense_tflops;
  if (name == "hbm_gbps") return p.hbm_gbps;
  if (name == "flash_topk_tflops") return p.flash_topk_tflops;
  if (name == "flash_topk_fp8_tflops") return p.flash_topk_fp8_tflops;
  if (name == "table_topk_tflops") return p.table_topk_tflops;
  if (name == "gather_fwd_tflops") return p.gather_fwd_tflops;
  if (name == "gather_bwd_tflops") return p.gather_bwd_tflops;
  if (name == "indexer_mass_tflops") return p.indexer_mass_tflops;
  if (name == "index_score_bwd_tflops") return p.index_score_bwd_tflops;
  if (name == "latent_fwd_tflops") return p.latent_fwd_tflops;
  if (name == "latent_bwd_tflops") return p.latent_bwd_tflops;
  if (name == "latent_mass_tflops") return p.latent_mass_tflops;
  if (name == "dense_indexer_loss_tflops") return p.dense_indexer_loss_tflops;
  if (name == "optimizer_bytes_per_parameter") return p.optimizer_bytes_per_parameter;
  return p.kernel_launch_s;
}

TEST_F(CalibrateTest, QuickCpuRunWritesAFileThePlannerLoads) {
  const std::string out = Path("cpu.json");
  const Result run = Calibrate({"--quick", "--device", "cpu", "--out", out});
  ASSERT_EQ(run.code, 0) << run.output;
  const auto doc = nlohmann::json::parse(ReadFile(out));
  EXPECT_EQ(doc["device"], "cpu");
  EXPECT_NE(doc["source"].get<std::string>().find("hyscale-calibrate"), std::string::npos);
  EXPECT_TRUE(doc["date"].is_string());
  EXPECT_EQ(doc["shapes"]["seq_len"], "128");  // an int64: a string in protobuf's JSON mapping
  // Only G = 1 on the CPU, and the notes say so; collectives are skipped with a note too.
  ASSERT_EQ(doc["sparse_attention"].size(), 1u);
  EXPECT_EQ(doc["sparse_attention"][0]["group"], 1);
  EXPECT_EQ(doc["sparse_attention"][0]["dedup"], 1.0);
  const std::string notes = doc["notes"].dump();
  EXPECT_NE(notes.find("G = 1 only"), std::string::npos) << notes;
  EXPECT_NE(notes.find("collective figures"), std::string::npos) << notes;
  // The indexer loss counts every one of the N k slots (--quick CPU: N 128, k 16, H 4, d_qk 32,
  // H_I 4, d_I 16), as the cost model counts k a query.
  EXPECT_EQ(doc["measurements"]["indexer_mass"]["flops"], 2.0 * 4 * 32 * 128 * 16);
  EXPECT_EQ(doc["measurements"]["index_score_bwd"]["flops"], 4.0 * 4 * 16 * 128 * 16);
  // The dense warm-up's loss: every one of the N(N+1)/2 visible pairs of one sequence (N 128 as
  // --seq-len), 2 H d_qk for the logits and 6 H_I d_I for the index scores and their backward.
  EXPECT_EQ(doc["shapes"]["dense_loss_seq_len"], "128");
  EXPECT_EQ(doc["measurements"]["dense_indexer_loss"]["flops"],
            128.0 * 129 / 2 * (2 * 4 * 32 + 6 * 4 * 16));
  // The optimizer's step over its parameters: the figure is its time at the copy's bandwidth.
  const auto& optimizer = doc["measurements"]["optimizer"];
  EXPECT_EQ(doc["shapes"]["optimizer_parameters"], "262144");
  EXPECT_GE(optimizer["parameters"].get<double>(), 0.9 * 262144);
  EXPECT_NEAR(doc["optimizer_bytes_per_parameter"].get<double>(),
              optimizer["median_s"].get<double>() *
                  doc["measurements"]["copy"]["bytes"].get<double>() /
                  doc["measurements"]["copy"]["median_s"].get<double>() /
                  optimizer["parameters"].get<double>(),
              1e-6 * doc["optimizer_bytes_per_parameter"].get<double>());

  auto profile = planner::BuiltinProfile("cpu");
  ASSERT_TRUE(profile.ok());
  const planner::DeviceProfile builtin = *profile;
  ASSERT_TRUE(planner::LoadCalibration(out, &*profile).ok());
  for (const char* name : kFigures) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(doc.contains(name));
    EXPECT_GT(doc[name].get<double>(), 0);
    EXPECT_EQ(Figure(*profile, name), doc[name].get<double>());
    EXPECT_EQ(profile->sources.at(name).rfind("calibrated: hyscale-calibrate", 0), 0u)
        << profile->sources.at(name);
  }
  const auto& g1 = profile->sparse_attention.at(1);
  EXPECT_EQ(g1.fwd_tflops, doc["sparse_attention"][0]["fwd_tflops"].get<double>());
  EXPECT_EQ(g1.bwd_tflops, doc["sparse_attention"][0]["bwd_tflops"].get<double>());
  EXPECT_NE(g1.fwd_tflops, builtin.sparse_attention.at(1).fwd_tflops);
  // Groups the CPU cannot measure keep the built-in figures.
  EXPECT_EQ(profile->sparse_attention.at(4).fwd_tflops, builtin.sparse_attention.at(4).fwd_tflops);
  EXPECT_EQ(profile->sparse_attention.at(4).dedup, builtin.sparse_attention.at(4).dedup);
}

// Each case loads libtorch (about a second): a few, one per kind of check.
TEST_F(CalibrateTest, BadFlagsExit2NamingTheFlag) {
  const std::string out = Path("never.json");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--quick"}, "--out"},
      {{"--out", Path("no/such/dir/f.json")}, "--out"},
      {{"--out", out, "--device", "tpu"}, "--device"},
      {{"--out", out, "--seq-len", "0"}, "--seq-len"},
      {{"--out", out, "--quick", "--device", "cpu", "--seq-len", "64", "--topk", "128"}, "--topk"},
  };
  for (const auto& [args, flag] : cases) {
    const Result run = Calibrate(args);
    SCOPED_TRACE(::testing::PrintToString(args));
    EXPECT_EQ(run.code, 2) << run.output;
    EXPECT_NE(run.output.find(flag), std::string::npos) << run.output;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(CalibrateTest, PlanUsesTheCalibration) {
  const std::string out = Path("cpu.json");
  ASSERT_EQ(Calibrate({"--quick", "--device", "cpu", "--out", out}).code, 0);
  const std::string spec = Path("job.yaml");
  std::ofstream(spec) << cli::testing::TinySparseSpec();
  const Result plan = RunCommand(HYSCALE_CLI_BIN, {"-o", "json", "plan", spec, "--gpus", "1",
                                                   "--gpu", "cpu", "--calibration", out});
  ASSERT_EQ(plan.code, 0) << plan.output;
  const auto doc = nlohmann::json::parse(plan.output);
  EXPECT_EQ(doc["profile"], "cpu");
  EXPECT_EQ(doc["sources"]["dense_tflops"].get<std::string>().rfind("calibrated: ", 0), 0u);
  EXPECT_EQ(doc["sources"]["sparse_attention[1].fwd_tflops"].get<std::string>().rfind(
                "calibrated: hyscale-calibrate", 0),
            0u);
  // Against the built-in figures the predicted step differs.
  const Result builtin =
      RunCommand(HYSCALE_CLI_BIN, {"-o", "json", "plan", spec, "--gpus", "1", "--gpu", "cpu"});
  ASSERT_EQ(builtin.code, 0) << builtin.output;
  EXPECT_NE(nlohmann::json::parse(builtin.output)["candidates"][0]["step_seconds"],
            doc["candidates"][0]["step_seconds"]);
}

TEST_F(CalibrateTest, DescriptiveKeysAreCheckedNotUsed) {
  auto profile = planner::BuiltinProfile("cpu");
  ASSERT_TRUE(profile.ok());
  EXPECT_TRUE(planner::ApplyCalibration(
                  R"({"device": "cpu", "device_name": "cpu", "commit": "abc", "date": "today",
                      "shapes": {"seq_len": 8}, "measurements": {}, "notes": ["n"]})",
                  &*profile)
                  .ok());
  for (const char* bad : {R"({"shapes": 3})", R"({"commit": 1})", R"({"shapes": {"seq": 1}})"}) {
    const auto status = planner::ApplyCalibration(bad, &*profile);
    EXPECT_FALSE(status.ok()) << bad;
  }
  EXPECT_NE(planner::ApplyCalibration(R"({"notes": [1]})", &*profile).message().find("notes"),
            std::string::npos);
}

TEST_F(CalibrateTest, QuickCudaRunMeasuresEveryGroup) {
  const std::string out = Path("cuda.json");
  const Result run = Calibrate({"--quick", "--device", "cuda", "--out", out});
  if (run.code == 2 && run.output.find("--device cuda") != std::string::npos) {
    GTEST_SKIP() << "no CUDA here: " << run.output;
  }
  ASSERT_EQ(run.code, 0) << run.output;
  const auto doc = nlohmann::json::parse(ReadFile(out));
  ASSERT_EQ(doc["sparse_attention"].size(), 5u) << doc.dump(2);  // k = 512: G = 1 .. 16
  EXPECT_GT(doc["latent_bwd_tflops"].get<double>(), 0);          // 576 / 512: the latent kernels
  for (const auto& row : doc["sparse_attention"]) {
    EXPECT_GE(row["dedup"].get<double>(), 1.0) << row.dump();
  }
  auto profile = planner::BuiltinProfile("h200");
  ASSERT_TRUE(profile.ok());
  EXPECT_TRUE(planner::LoadCalibration(out, &*profile).ok());
}

}  // namespace
}  // namespace hyscale::calibrate
