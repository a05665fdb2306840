#include "worker/trainer/optimizer.h"

#include <torch/nn/utils/clip_grad.h>

#include <vector>

#include "kernels/torch/compat.h"

namespace hyscale::trainer {
namespace {

// Each group's parameters that have a gradient (AdamW steps those alone).
std::vector<std::vector<torch::Tensor>> trained_by_group(torch::optim::AdamW& optimizer) {
  std::vector<std::vector<torch::Tensor>> out;
  for (const auto& group : optimizer.param_groups()) {
    auto& trained = out.emplace_back();
    for (const auto& p : group.params()) {
      if (p.grad().defined()) trained.push_back(p);
    }
  }
  return out;
}

// Whether ATen's fused AdamW takes every trained parameter: fp32 dense tensors on one CUDA
// device, no amsgrad.
bool fused_adamw_applies(torch::optim::AdamW& optimizer,
                         const std::vector<std::vector<torch::Tensor>>& trained) {
  if (!compat::kHasFusedAdamW) return false;
  c10::optional<torch::Device> device;
  for (size_t g = 0; g < trained.size(); ++g) {
    const auto& options =
        static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[g].options());
    if (options.amsgrad()) return false;
    for (const auto& p : trained[g]) {
      if (!p.is_cuda() || p.scalar_type() != torch::kFloat ||
          p.grad().scalar_type() != torch::kFloat || p.grad().is_sparse() ||
          (device && p.device() != *device)) {
        return false;
      }
      device = p.device();
    }
  }
  return true;
}

torch::optim::AdamWParamState& state_of(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto& slot = optimizer.state()[compat::optimizer_state_key(p)];
  if (!slot) {  // as AdamW::step starts a parameter
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::AdamWParamState&>(*slot);
}

void fused_adamw_step(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& parameters,
                      const std::vector<std::vector<torch::Tensor>>& trained, double grad_clip) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  c10::optional<torch::Tensor> grad_scale;
  if (grad_clip > 0) {
    // clip_grad_norm_ multiplies by min(1, clip / (norm + 1e-6)); the kernel divides by this.
    const auto norm = at::linalg_vector_norm(torch::stack(at::_foreach_norm(grads)), 2);
    grad_scale = torch::clamp_min((norm + 1e-6) / grad_clip, 1.0);
  }
  for (size_t g = 0; g < trained.size(); ++g) {
    const auto& params = trained[g];
    if (params.empty()) continue;
    const auto& options =
        static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[g].options());
    std::vector<torch::Tensor> group_grads, exp_avgs, exp_avg_sqs;
    std::vector<float> steps;
    for (const auto& p : params) {
      auto& s = state_of(optimizer, p);
      s.step(s.step() + 1);
      group_grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      steps.push_back(static_cast<float>(s.step()));
    }
    // The kernel reads each parameter's step from the device (0-dim fp32 tensors), copied from
    // pinned memory so the host does not wait for the step's queued work.
    const auto step_tensors = torch::tensor(steps)
                                  .pin_memory()
                                  .to(params.front().device(), /*non_blocking=*/true)
                                  .unbind(0);
    compat::fused_adamw(params, group_grads, exp_avgs, exp_avg_sqs, step_tensors, options.lr(),
                        std::get<0>(options.betas()), std::get<1>(options.betas()),
                        options.weight_decay(), options.eps(), grad_scale);
  }
}

}  // namespace

std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& model,
                                                const v1::OptimizerSpec& spec) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  torch::optim::AdamWOptions options;
  options.betas({spec.beta1(), spec.beta2()}).eps(spec.eps()).weight_decay(spec.weight_decay());
  auto no_decay_options = std::make_unique<torch::optim::AdamWOptions>(options);
  no_decay_options->weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay);
  groups.emplace_back(no_decay, std::move(no_decay_options));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

bool adamw_step(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& parameters,
                double grad_clip) {
  torch::NoGradGuard no_grad;
  if (const auto trained = trained_by_group(optimizer); fused_adamw_applies(optimizer, trained)) {
    fused_adamw_step(optimizer, parameters, trained, grad_clip);
    return true;
  }
  if (grad_clip > 0) torch::nn::utils::clip_grad_norm_(parameters, grad_clip);
  optimizer.step();
  return false;
}

void clear_gradients(torch::nn::Module& model) {
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
}

std::map<std::string, torch::Tensor> optimizer_state(const torch::optim::AdamW& optimizer,
                                                     const torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> out;
  const auto& state = optimizer.state();
  for (const auto& item : model.named_parameters()) {
    const auto it = state.find(compat::optimizer_state_key(item.value()));
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out["exp_avg/" + item.key()] = s.exp_avg();
    out["exp_avg_sq/" + item.key()] = s.exp_avg_sq();
    out["step/" + item.key()] = torch::tensor({s.step()}, torch::kInt64);
  }
  return out;
}

absl::Status load_optimizer_state(torch::optim::AdamW& optimizer, const torch::nn::Module& model,
                                  const std::map<std::string, torch::Tensor>& state) {
  std::map<compat::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>> restored;
  for (const auto& item : model.named_parameters()) {
    const auto avg = state.find("exp_avg/" + item.key());
    if (avg == state.end()) continue;
    const auto avg_sq = state.find("exp_avg_sq/" + item.key());
    const auto step = state.find("step/" + item.key());
    if (avg_sq == state.end() || step == state.end()) {
      return absl::FailedPreconditionError("incomplete optimizer state for " + item.key());
    }
    if (avg->second.sizes() != item.value().sizes() ||
        avg_sq->second.sizes() != item.value().sizes() || step->second.numel() != 1) {
      return absl::FailedPreconditionError("optimizer state for " + item.key() +
                                           " does not fit the parameter's shape");
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->exp_avg(avg->second.to(item.value().device(), /*non_blocking=*/false, /*copy=*/true));
    s->exp_avg_sq(avg_sq->second.to(item.value().device(), /*non_blocking=*/false, /*copy=*/true));
    s->step(step->second.item<int64_t>());
    restored[compat::optimizer_state_key(item.value())] = std::move(s);
  }
  auto& target = optimizer.state();
  target.clear();
  for (auto& [key, s] : restored) target[key] = std::move(s);
  return absl::OkStatus();
}

}  // namespace hyscale::trainer
