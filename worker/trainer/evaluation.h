// Evaluation metrics computed from a forward pass: next-token accuracy at the positions with a
// target, and the indexer's selection quality.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "worker/trainer/model.h"

namespace hyscale::trainer {

// Fraction of positions with target >= 0 whose argmax prediction equals the target, as
// {correct, counted}.
struct Accuracy {
  int64_t correct = 0;
  int64_t counted = 0;
  double value() const { return counted == 0 ? 0.0 : static_cast<double>(correct) / counted; }
};
Accuracy token_accuracy(const torch::Tensor& logits, const torch::Tensor& targets);

// Recall of the indexer's top-k against the top-k keys by dense attention mass (summed over
// heads), averaged over layers and over up to `max_rows` query rows per sequence that see more
// than topk keys. Rows with a target are preferred (they are the ones the task scores).
double indexer_recall(const std::vector<LayerProbe>& probes, const torch::Tensor& targets,
                      const ModelConfig& config, int64_t max_rows);

}  // namespace hyscale::trainer
