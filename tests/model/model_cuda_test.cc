// The DSA model on the GPU (bf16 autocast, the CUDA kernels): query-chunked recomputation trains
// as the whole sequence does, and the frozen main model's indexer learns inside the forward as
// autograd after it teaches it, to bf16's precision. Skips without a CUDA build or device.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "kernels/torch/compat.h"
#include "tests/kernels/gpu_kernel_test.h"
#include "worker/model/model.h"

namespace hyscale::trainer {
namespace {

class ModelCudaTest : public test::GpuKernelTest {};

// Head shapes the CUDA kernels take (kernels/cuda_shapes.h), sized to run in a second.
ModelConfig gpu_config() {
  ModelConfig c;
  c.vocab_size = 64;
  c.d_model = 64;
  c.layers = 2;
  c.heads = 4;
  c.head_dim_qk = 64;
  c.rope_dim = 16;
  c.head_dim_v = 64;
  c.d_ff = 128;
  c.index_heads = 16;
  c.index_dim = 64;
  c.index_rope_dim = 16;
  c.topk = 64;
  return c;
}

struct Step {
  std::map<std::string, torch::Tensor> grads;  // fp32, on the CPU
  double indexer_loss = 0;
};

// One step from a fixed init on fixed tokens; `indexer_only`: only the indexer's parameters
// train, by `weight` x the indexer loss (inside the forward when options.frozen_main).
Step run_step(const ForwardOptions& options, bool indexer_only, double weight) {
  torch::manual_seed(11);
  const ModelConfig config = gpu_config();
  DsaModel model(config);
  model->to(torch::kCUDA);
  for (auto& p : model->named_parameters()) {
    p.value().set_requires_grad(!indexer_only || p.key().find(".indexer.") != std::string::npos);
  }
  const auto tokens = torch::randint(config.vocab_size, {1, 600}, torch::kLong).to(torch::kCUDA);
  ForwardResult result;
  torch::Tensor loss;
  {
    compat::CudaBf16Autocast autocast(true);
    result = model->forward(tokens, options);
    loss = weight * result.indexer_loss.to(torch::kFloat);
    if (!indexer_only) {
      loss = loss +
             torch::nn::functional::cross_entropy(
                 result.logits.view({-1, config.vocab_size}).to(torch::kFloat), tokens.view(-1));
    }
  }
  if (!options.frozen_main) loss.backward();
  Step step;
  for (const auto& p : model->named_parameters()) {
    if (p.value().grad().defined()) {
      step.grads[p.key()] = p.value().grad().to(torch::kCPU, torch::kFloat);
    }
  }
  step.indexer_loss = result.reported_indexer_loss().item<double>();
  return step;
}

void expect_close(const Step& got, const Step& want, const std::string& what) {
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, grad] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << what << ": " << name;
    const double scale = grad.norm().item<double>();
    const double off = (got.grads.at(name) - grad).norm().item<double>();
    EXPECT_LE(off, 3e-2 * scale + 1e-6)
        << what << ": " << name << " |diff| " << off << " of " << scale;
  }
  EXPECT_NEAR(got.indexer_loss, want.indexer_loss, 3e-2 * std::abs(want.indexer_loss) + 1e-6)
      << what;
}

ForwardOptions gpu_options(AttentionMode mode) {
  ForwardOptions o;
  o.attention = mode;
  o.recompute = true;
  o.selection_replay = true;
  o.bf16_autocast = true;
  o.clock = c10::make_intrusive<PhaseClock>(torch::Device(torch::kCUDA, 0));
  return o;
}

TEST_F(ModelCudaTest, QueryChunksTrainLikeTheWholeSequence) {
  for (const auto mode : {AttentionMode::kSparse, AttentionMode::kDense}) {
    const Step whole = run_step(gpu_options(mode), false, 0.1);
    ForwardOptions chunked = gpu_options(mode);
    chunked.query_chunk = 160;  // 600 tokens: three chunks and a short one
    expect_close(run_step(chunked, false, 0.1), whole,
                 mode == AttentionMode::kSparse ? "sparse" : "dense");
  }
}

TEST_F(ModelCudaTest, FrozenMainModelTrainsTheIndexerInsideTheForward) {
  for (const auto mode : {AttentionMode::kDense, AttentionMode::kSparse}) {
    ForwardOptions after = gpu_options(mode);
    after.recompute = false;
    const Step want = run_step(after, true, 0.5);
    ForwardOptions inside = after;
    inside.frozen_main = true;
    inside.indexer_grad_scale = 0.5;
    inside.query_chunk = 160;
    const Step got = run_step(inside, true, 0.5);
    EXPECT_FALSE(got.grads.empty());
    expect_close(got, want, mode == AttentionMode::kSparse ? "frozen sparse" : "frozen dense");
  }
}

}  // namespace
}  // namespace hyscale::trainer
