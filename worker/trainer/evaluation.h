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

// How many keys the selections of adjacent query rows share. For each G of groups: the valid
// entries of G consecutive rows' selections over their distinct keys, summed over the groups of
// the sharing rows in every probe (layer) and sequence: 1 when no key is shared, G when the rows
// select alike. Sums, so that the ranks of a group can add theirs.
struct KeySharing {
  // G = 2, 4, .. up to rows, each with zero sums.
  explicit KeySharing(int64_t rows);
  std::vector<int64_t> groups;   // G
  std::vector<double> selected;  // valid entries, a G
  std::vector<double> distinct;  // distinct keys, a G
  // selected over distinct for groups[i]; 1 without a group.
  double ratio(size_t i) const { return distinct[i] == 0 ? 1.0 : selected[i] / distinct[i]; }
};

// The local rows key_sharing reads: the last `rows` of consecutive positions that see more than
// topk keys (fewer where the shard has fewer), increasing. A round-robin context-parallel shard
// has no two consecutive positions: its rank adds nothing.
torch::Tensor sharing_rows(const torch::Tensor& positions, const ModelConfig& config, int64_t rows);

// Key sharing over the probes' rows of sharing_rows(positions, config, rows), for G = 2, 4, ..
// up to `rows` (the same list on every rank), in groups of G from the first of those rows.
KeySharing key_sharing(const std::vector<LayerProbe>& probes, const torch::Tensor& positions,
                       const ModelConfig& config, int64_t rows);

}  // namespace hyscale::trainer
