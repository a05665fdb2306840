// adamw_step against what it replaces, torch::nn::utils::clip_grad_norm_ then
// torch::optim::AdamW::step: the same weights, moments and step counts after steps that clip and
// steps that do not, with a parameter that has no gradient left alone. On the CPU both run the
// same calls; on a GPU (skipped without one) adamw_step runs ATen's fused AdamW where libtorch has
// it, and agrees to fp32 rounding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "hyscale/v1/job.pb.h"
#include "kernels/torch/compat.h"
#include "worker/trainer/optimizer.h"

namespace hyscale::trainer {
namespace {

// The shapes AdamW meets in the model: matrices (decayed), a stack of them, vectors (not decayed),
// and one parameter that does not train.
struct Weights : torch::nn::Module {
  explicit Weights(torch::Device device) {
    w = register_parameter("w", torch::randn({64, 48}, device));
    stacked = register_parameter("stacked", torch::randn({3, 16, 8}, device));
    bias = register_parameter("bias", torch::randn({48}, device));
    frozen = register_parameter("frozen", torch::randn({32}, device));
  }
  torch::Tensor w, stacked, bias, frozen;
};

v1::OptimizerSpec Spec() {
  v1::OptimizerSpec spec;
  spec.set_weight_decay(0.1);
  spec.set_beta1(0.9);
  spec.set_beta2(0.95);
  spec.set_eps(1e-8);
  return spec;
}

// Three steps of both on equal weights and gradients: the first two clipped (the gradients' norm
// far above grad_clip), the last not.
void ExpectStepsAsLibtorch(torch::Device device, double tolerance, bool fused) {
  torch::manual_seed(7);
  Weights reference(device), ours(device);
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : reference.named_parameters()) {
      ours.named_parameters()[item.key()].copy_(item.value());
    }
  }
  auto reference_optimizer = make_adamw(reference, Spec());
  auto our_optimizer = make_adamw(ours, Spec());
  constexpr double kClip = 1.0;
  for (const double gradient_size : {100.0, 10.0, 1e-3}) {
    for (auto& item : reference.named_parameters()) {
      if (item.key() == "frozen") continue;
      const auto grad = torch::randn_like(item.value()) * gradient_size;
      item.value().mutable_grad() = grad.clone();
      ours.named_parameters()[item.key()].mutable_grad() = grad.clone();
    }
    set_learning_rate(*reference_optimizer, 1e-2);
    set_learning_rate(*our_optimizer, 1e-2);
    torch::nn::utils::clip_grad_norm_(reference.parameters(), kClip);
    reference_optimizer->step();
    EXPECT_EQ(adamw_step(*our_optimizer, ours.parameters(), kClip), fused);
  }

  const auto& reference_state = reference_optimizer->state();
  const auto& our_state = our_optimizer->state();
  for (const auto& item : reference.named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    const auto mine = ours.named_parameters()[name];
    EXPECT_TRUE(torch::allclose(mine, p, tolerance, tolerance)) << name;
    const auto key = compat::optimizer_state_key(mine);
    if (name == "frozen") {
      EXPECT_EQ(our_state.count(key), 0u) << "a parameter without a gradient got state";
      EXPECT_TRUE(torch::equal(mine, p));
      continue;
    }
    ASSERT_EQ(our_state.count(key), 1u) << name;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*our_state.at(key));
    const auto& r = static_cast<const torch::optim::AdamWParamState&>(
        *reference_state.at(compat::optimizer_state_key(p)));
    EXPECT_EQ(s.step(), r.step()) << name;
    EXPECT_TRUE(torch::allclose(s.exp_avg(), r.exp_avg(), tolerance, tolerance)) << name;
    EXPECT_TRUE(torch::allclose(s.exp_avg_sq(), r.exp_avg_sq(), tolerance, tolerance)) << name;
  }
}

TEST(OptimizerTest, StepsAsClipGradNormThenAdamWOnTheCpu) {
  ExpectStepsAsLibtorch(torch::kCPU, 0.0, /*fused=*/false);
}

TEST(OptimizerTest, StepsAsClipGradNormThenAdamWOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
  ExpectStepsAsLibtorch(torch::kCUDA, 1e-5, compat::kHasFusedAdamW);
}

}  // namespace
}  // namespace hyscale::trainer
