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

void load_optimizer_state(torch::optim::AdamW& optimizer, const torch::nn::Module& model,
                          const std::map<std::string, torch::Tensor>& state) {
  auto& target = optimizer.state();
  target.clear();
  for (const auto& item : model.named_parameters()) {
    const auto avg = state.find("exp_avg/" + item.key());
    if (avg == state.end()) continue;
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->exp_avg(avg->second.clone());
    s->exp_avg_sq(state.at("exp_avg_sq/" + item.key()).clone());
    s->step(state.at("step/" + item.key()).item<int64_t>());
    target[compat::optimizer_state_key(item.value())] = std::move(s);
  }
}

}  // namespace hyscale::trainer
