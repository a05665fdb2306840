// Evaluation from a forward pass: predicted tokens (scored by ScoreQueries in data.h) and the
// indexer's selection quality.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "worker/model/model.h"

namespace hyscale::trainer {

// Argmax predictions of logits [B, T, vocab] as token ids, row-major (Batch::targets' layout).
std::vector<int32_t> predicted_tokens(const torch::Tensor& logits);

// Recall of the indexer's top-k against the top-k keys by dense attention mass (summed over
// heads), over layers and over up to `max_rows` query rows per sequence that see more than topk
// keys. Rows with a target are preferred (they are the ones the task scores). targets [B, N] is
// the whole batch; the probes' queries are this rank's rows, at global `positions` [T], and their
// keys cover the whole sequence. A sum, so that the ranks of a group can add theirs.
struct IndexerRecall {
  double total = 0;  // sum of per-row recalls
  int64_t rows = 0;
  double value() const { return rows == 0 ? 1.0 : total / static_cast<double>(rows); }
};
IndexerRecall indexer_recall(const std::vector<LayerProbe>& probes, const torch::Tensor& targets,
                             const torch::Tensor& positions, const ModelConfig& config,
                             int64_t max_rows);

// The local rows indexer_recall scores in some sequence of the batch, increasing: what the
// forward's probes need to keep (ForwardOptions::probe_rows).
torch::Tensor recall_rows(const torch::Tensor& targets, const torch::Tensor& positions,
                          const ModelConfig& config, int64_t max_rows);

}  // namespace hyscale::trainer
