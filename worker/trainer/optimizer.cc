#include "worker/trainer/optimizer.h"

#include "kernels/torch/compat.h"

namespace hyscale::trainer {

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
