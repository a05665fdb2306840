// Per-layer activation recomputation: forward keeps only the layer's input (and, for selection
// replay, its top-k indices); backward re-runs the layer and backpropagates through it.
#pragma once

#include <torch/types.h>

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

}  // namespace hyscale::trainer
