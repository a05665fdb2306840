// AdamW over the model, with weight decay on matrices only, and its state as named tensors so a
// checkpoint can store it next to the weights.
#pragma once

#include <absl/status/status.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyscale/v1/job.pb.h"

namespace hyscale::trainer {

std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& model,
                                                const v1::OptimizerSpec& spec);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// One step of `optimizer` over the parameters with a gradient, their gradients first scaled to a
// global 2-norm of at most grad_clip (when > 0), as torch::nn::utils::clip_grad_norm_(parameters)
// then AdamW::step do (`parameters`: the optimizer's, in the order the norm sums them). Where
// every trained parameter is fp32 on one CUDA device and libtorch has ATen's fused AdamW, a group
// is one kernel over its weights, gradients and moments (42 bytes a parameter at copy bandwidth
// on an H100, measured by hyscale-calibrate, against the eleven element-wise passes' 100) with the
// clipping as its gradient scale, and the state stays the optimizer's (checkpoints unchanged).
// Returns whether it was.
bool adamw_step(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& parameters,
                double grad_clip);

// Drops every gradient (not just zeroes it), so parameters that do not train this step are
// skipped by AdamW: no moment decay, no weight decay on frozen weights.
void clear_gradients(torch::nn::Module& model);

// "exp_avg/<param>", "exp_avg_sq/<param>" and "step/<param>" for every parameter with state.
std::map<std::string, torch::Tensor> optimizer_state(const torch::optim::AdamW& optimizer,
                                                     const torch::nn::Module& model);
// Restores what optimizer_state() returned; a parameter missing from `state` starts fresh.
// Fails, naming the tensor, when an entry is incomplete or does not fit its parameter.
absl::Status load_optimizer_state(torch::optim::AdamW& optimizer, const torch::nn::Module& model,
                                  const std::map<std::string, torch::Tensor>& state);

}  // namespace hyscale::trainer
