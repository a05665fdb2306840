// Per-layer activation recomputation: forward keeps only the layer's input (and, for selection
// replay, its top-k indices); backward re-runs the layer and backpropagates through it.
#pragma once

#include <torch/types.h>

#include <functional>

#include "worker/model/model.h"

namespace hyscale::trainer {

// Same result as layer->forward(x, options, {}, stats), with activations recomputed in
// backward. With options.selection_replay the recomputation replays the forward's indices and
// recomputes index scores only at them; without it, selection runs again (the baseline).
// The indexer loss is computed only by the recomputation: the output's value is 0 (its gradient
// is the same), and the recomputed loss times `report_scale` is added into `loss_report` (a
// scalar, in its dtype) during backward.
LayerOutput checkpointed_layer(const DsaLayer& layer, const torch::Tensor& x,
                               const ForwardOptions& options, SelectionStats& stats,
                               const torch::Tensor& loss_report, double report_scale);

// f(x), keeping only x for the backward, which runs f again (in the clock's recompute pass) and
// backpropagates through it. For parts whose activations are wider than their input: the final
// norm and the output projection keep 6 bytes a model feature and token otherwise.
torch::Tensor checkpointed(std::function<torch::Tensor(const torch::Tensor&)> f,
                           const torch::Tensor& x, const c10::intrusive_ptr<PhaseClock>& clock);

}  // namespace hyscale::trainer
