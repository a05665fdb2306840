// Evaluation from a forward pass: predicted tokens (scored by ScoreQueries in data.h) and the
// indexer's selection quality.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "worker/trainer/model.h"

namespace hyscale::trainer {

// Argmax predictions of logits [B, T, vocab] as token ids, row-major (Batch::targets' layout).
std::vector<int32_t> predicted_tokens(const torch::Tensor& logits);

// Recall of the indexer's top-k against the top-k keys by dense attention mass (summed over
// heads), averaged over layers and over up to `max_rows` query rows per sequence that see more
// than topk keys. Rows with a target are preferred (they are the ones the task scores).
double indexer_recall(const std::vector<LayerProbe>& probes, const torch::Tensor& targets,
                      const ModelConfig& config, int64_t max_rows);

}  // namespace hyscale::trainer
