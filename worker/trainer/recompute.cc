#include "worker/trainer/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/torch/compat.h"

namespace hyscale::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved input; lives as long as the autograd graph.
struct RecomputeState : torch::CustomClassHolder {
  DsaLayer layer{nullptr};
  ForwardOptions options;
  SelectionStats* stats = nullptr;
  torch::Tensor indices;  // the forward's selection, replayed in recomputation
};

struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  // Returns {x_out, indexer_loss}; runs with grad mode off, so no activation is kept.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const c10::intrusive_ptr<RecomputeState>& state) {
    LayerOutput out = state->layer->forward(x, state->options, torch::Tensor(), *state->stats);
    state->indices = out.indices;
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    const auto loss = out.indexer_loss.defined() ? out.indexer_loss : torch::zeros({}, x.options());
    return {out.x, loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state =
        c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    const auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::AutoGradMode grad_mode(true);
    compat::CudaBf16Autocast autocast(state->options.bf16_autocast);
    LayerOutput out;
    {
      PhaseClock::PassGuard pass(*state->options.clock, Pass::kRecompute);
      const auto replay = state->options.selection_replay ? state->indices : torch::Tensor();
      out = state->layer->forward(x, state->options, replay, *state->stats);
    }

    std::vector<torch::Tensor> outputs, output_grads;
    const auto add = [&](const torch::Tensor& output, const torch::Tensor& grad) {
      if (output.defined() && output.requires_grad() && grad.defined()) {
        outputs.push_back(output);
        output_grads.push_back(grad);
      }
    };
    add(out.x, grads[0]);
    add(out.indexer_loss, grads[1]);
    if (!outputs.empty()) torch::autograd::backward(outputs, output_grads);
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

LayerOutput checkpointed_layer(const DsaLayer& layer, const torch::Tensor& x,
                               const ForwardOptions& options, SelectionStats& stats) {
  auto state = c10::make_intrusive<RecomputeState>();
  state->layer = layer;
  state->options = options;
  state->options.keep_probes = false;
  state->stats = &stats;
  // The function needs a differentiable input for its backward to run at all; when nothing
  // upstream trains (a frozen embedding), x becomes a leaf whose gradient goes nowhere.
  const auto input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  auto outputs = CheckpointedLayer::apply(input, state);
  LayerOutput out;
  out.x = outputs[0];
  if (options.indexer_loss) out.indexer_loss = outputs[1];
  out.indices = state->indices;
  return out;
}

}  // namespace hyscale::trainer
