#include "worker/model/recompute.h"

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
  Replay replay;              // the forward's selection, replayed in recomputation
  torch::Tensor loss_report;  // the recomputed indexer loss is added here, times report_scale
  double report_scale = 1;
};

struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  // Returns {x_out, indexer_loss}; runs with grad mode off, so no activation is kept. The indexer
  // loss's value does not shape any gradient (its gradient is the loss weight), so the forward
  // skips it (its target costs as much as the attention's scores) and returns 0 in its place: the
  // recomputation computes it, and reports its value.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const c10::intrusive_ptr<RecomputeState>& state) {
    ForwardOptions options = state->options;
    options.indexer_loss = false;
    // A replay that trains the indexer takes the scores' normalizer with the indices.
    options.keep_score_lse = state->options.indexer_loss && state->options.selection_replay &&
                             state->options.attention == AttentionMode::kSparse;
    LayerOutput out = state->layer->forward(x, options, {}, *state->stats);
    state->replay = {out.indices, out.score_lse};
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return {out.x, torch::zeros({}, x.options())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state =
        c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    const auto x = ctx->get_saved_variables()[0];
    compat::CudaBf16Autocast autocast(state->options.bf16_autocast);
    const Replay replay = state->options.selection_replay ? state->replay : Replay{};
    const DsaLayerImpl::Recomputed out = state->layer->recompute_backward(
        x, grads[0], grads[1], state->options, replay, *state->stats);
    if (out.indexer_loss.defined() && state->loss_report.defined()) {
      torch::NoGradGuard no_grad;
      state->loss_report.add_(out.indexer_loss.to(state->loss_report.scalar_type()) *
                              state->report_scale);
    }
    return {out.x_grad, torch::Tensor()};
  }
};

struct RecomputedFunction : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> f;
  c10::intrusive_ptr<PhaseClock> clock;
};

struct Checkpointed : torch::autograd::Function<Checkpointed> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const c10::intrusive_ptr<RecomputedFunction>& state) {
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return state->f(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<RecomputedFunction>(
        ctx->saved_data["state"].toCapsule());
    const auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::AutoGradMode grad_mode(true);
    torch::Tensor y;
    {
      PhaseClock::PassGuard pass(*state->clock, v1::STEP_PASS_RECOMPUTE);
      y = state->f(x);
    }
    if (y.requires_grad() && grads[0].defined()) torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpointed(std::function<torch::Tensor(const torch::Tensor&)> f,
                           const torch::Tensor& x, const c10::intrusive_ptr<PhaseClock>& clock) {
  auto state = c10::make_intrusive<RecomputedFunction>();
  state->f = std::move(f);
  state->clock = clock;
  const auto input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return Checkpointed::apply(input, state);
}

LayerOutput checkpointed_layer(const DsaLayer& layer, const torch::Tensor& x,
                               const ForwardOptions& options, SelectionStats& stats,
                               const torch::Tensor& loss_report, double report_scale) {
  auto state = c10::make_intrusive<RecomputeState>();
  state->layer = layer;
  state->options = options;
  state->options.keep_probes = false;
  state->stats = &stats;
  state->loss_report = loss_report;
  state->report_scale = report_scale;
  // The function needs a differentiable input for its backward to run at all; when nothing
  // upstream trains (a frozen embedding), x becomes a leaf whose gradient goes nowhere.
  const auto input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  auto outputs = CheckpointedLayer::apply(input, state);
  LayerOutput out;
  out.x = outputs[0];
  if (options.indexer_loss) out.indexer_loss = outputs[1];
  out.indices = state->replay.indices;
  return out;
}

}  // namespace hyscale::trainer
