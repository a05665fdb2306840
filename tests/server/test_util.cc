#include "tests/server/test_util.h"

#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>

#include <vector>

#include "proto/job_spec.h"
#include "util/temp_dir.h"

namespace hyscale::server::testing {

std::string ScratchDir() {
  static std::vector<util::TempDir> dirs;  // removed when the test binary exits
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = util::TempDir::Create(
      absl::StrCat("hyscale_server_", info->test_suite_name(), "_", info->name()));
  EXPECT_TRUE(dir.ok()) << dir.status();
  if (!dir.ok()) return "";
  dirs.push_back(*std::move(dir));
  return dirs.back().path();
}

v1::JobSpec TinySpec() {
  auto spec = ParseJobSpec(R"yaml(
name: tiny
seed: 1
model: {vocab_size: 64, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 16}}
data: {seq_len: 64, batch_size: 2, recall: {pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}
stages: [{steps: 20, lr: 1.0e-3}]
checkpoint: {every_steps: 5}
)yaml",
                           SpecFormat::kYaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

v1::SubmitJobRequest SubmitRequest(int ranks, int priority, int max_restarts) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = TinySpec();
  request.mutable_resources()->set_ranks(ranks);
  request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  if (ranks > 1) {  // a job's ranks are its context-parallel processes
    auto* parallelism = request.mutable_spec()->mutable_parallelism();
    parallelism->set_mode(v1::MANUAL);
    parallelism->set_context_parallel(ranks);
    parallelism->set_cp_layout("contiguous");
  }
  request.set_priority(priority);
  request.set_max_restarts(max_restarts);
  return request;
}

v1::RegisterWorkerRequest WorkerRequest(const std::string& name, int gpus) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_address(name + ".local");
  auto* device = request.add_devices();
  device->set_name("NVIDIA H200");
  device->set_kind(v1::DEVICE_KIND_GPU);
  device->set_memory_bytes(80'000'000'000);
  device->set_count(gpus);
  return request;
}

}  // namespace hyscale::server::testing
