// hyscaled --calibration: the coordinator plans on the calibrated profile, and refuses to start
// on a file it cannot use, naming it.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "proto/job_spec.h"
#include "server/clock.h"
#include "server/coordinator.h"
#include "tests/client/tiny_spec.h"
#include "util/subprocess.h"
#include "util/temp_dir.h"

namespace hyscale::server {
namespace {

class CoordinatorCalibrationTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.Path(name);
    std::ofstream(path) << text;
    return path;
  }

  absl::StatusOr<std::unique_ptr<Coordinator>> Open(const std::string& calibration,
                                                    const std::string& data = "data") {
    CoordinatorOptions options;
    options.data_dir = dir_.Path(data);
    options.calibration = calibration;
    return Coordinator::Open(options, &clock_, nullptr);
  }

  // The planner's step estimate for the tiny sparse job on one rank of `kind`.
  static double Step(Coordinator& coordinator, v1::DeviceKind kind) {
    v1::PlanJobRequest request;
    auto spec = ParseJobSpec(cli::testing::TinySparseSpec(), SpecFormat::kYaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    *request.mutable_spec() = *spec;
    request.mutable_resources()->set_ranks(1);
    request.mutable_resources()->set_device_kind(kind);
    auto plan = coordinator.PlanJob(request);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->step_seconds() : -1;
  }

  const util::TempDir dir_ = util::TempDir::Create("hyscale_coordinator_calibration").value();
  FakeClock clock_;
};

TEST_F(CoordinatorCalibrationTest, CpuFileCalibratesCpuJobsOnly) {
  auto builtin = Open("", "builtin");
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  // Ten times slower than the built-in CPU figures.
  const std::string file = Write("cpu.json", R"({"device": "cpu", "source": "test",
      "dense_tflops": 0.008, "flash_topk_tflops": 0.002, "table_topk_tflops": 0.001,
      "indexer_mass_tflops": 0.002, "index_score_bwd_tflops": 0.001,
      "sparse_attention": [{"group": 1, "fwd_tflops": 0.002, "bwd_tflops": 0.001}]})");
  auto calibrated = Open(file, "calibrated");
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  const double before = Step(**builtin, v1::DEVICE_KIND_CPU);
  const double after = Step(**calibrated, v1::DEVICE_KIND_CPU);
  EXPECT_GT(after, 5 * before);
  EXPECT_EQ(Step(**calibrated, v1::DEVICE_KIND_GPU), Step(**builtin, v1::DEVICE_KIND_GPU));
}

TEST_F(CoordinatorCalibrationTest, GpuFileCalibratesTheGpuProfile) {
  auto builtin = Open("", "builtin");
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  const std::string file = Write("h200.json", R"({"device": "h200", "dense_tflops": 79.3,
      "flash_topk_tflops": 38.4, "sparse_attention": [{"group": 1, "fwd_tflops": 12.7}]})");
  auto calibrated = Open(file, "calibrated");
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_GT(Step(**calibrated, v1::DEVICE_KIND_GPU), Step(**builtin, v1::DEVICE_KIND_GPU));
  EXPECT_EQ(Step(**calibrated, v1::DEVICE_KIND_CPU), Step(**builtin, v1::DEVICE_KIND_CPU));
}

TEST_F(CoordinatorCalibrationTest, UnusableFileFailsOpenNamingIt) {
  const std::string missing = dir_.Path("missing.json");
  const std::string broken = Write("broken.json", "{not json");
  const std::string bad_figure = Write("bad.json", R"({"device": "cpu", "dense_tflops": -1})");
  const std::string other_gpu = Write("h800.json", R"({"device": "h800", "dense_tflops": 1})");
  for (const auto& [file, why] : {std::pair<std::string, std::string>{missing, "cannot read"},
                                  {broken, "calibration: "},
                                  {bad_figure, "dense_tflops"},
                                  {other_gpu, "measured on h800"}}) {
    auto coordinator = Open(file);
    ASSERT_FALSE(coordinator.ok()) << file;
    const std::string message(coordinator.status().message());
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find(why), std::string::npos) << message;
  }
}

TEST_F(CoordinatorCalibrationTest, HyscaledRefusesToStartOnABadFile) {
  const std::string bad = Write("bad.json", R"({"device": "cpu", "warp_speed": 9})");
  util::Command command({HYSCALED_PATH, "--data-dir", dir_.Path("data"), "--listen", "127.0.0.1:0",
                         "--metrics-listen", "127.0.0.1:0", "--calibration", bad});
  command.stderr_to = util::Redirect::ToStdout();
  const auto run = util::RunAndCapture(std::move(command));
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string& output = run->output;
  EXPECT_EQ(run->exit.ShellCode(), 1) << output;
  EXPECT_NE(output.find(bad), std::string::npos) << output;
  EXPECT_NE(output.find("warp_speed"), std::string::npos) << output;
}

}  // namespace
}  // namespace hyscale::server
