#include "worker/trainer/evaluation.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace hyscale::trainer {
namespace {

// Query rows of sequence b to score, chosen over the whole sequence so that every rank of a
// context-parallel group makes the same choice: up to max_rows positions >= min_position with a
// target if there are any, else evenly spaced ones. Returned as local rows of `positions`.
std::vector<int64_t> sample_rows(const torch::Tensor& targets, const torch::Tensor& positions,
                                 int64_t b, int64_t min_position, int64_t max_rows) {
  const auto row = targets[b];
  const auto row_targets = row.accessor<int64_t, 1>();
  const int64_t n = row_targets.size(0);
  std::vector<int64_t> chosen;  // global positions
  for (int64_t p = min_position; p < n && static_cast<int64_t>(chosen.size()) < max_rows; ++p) {
    if (row_targets[p] >= 0) chosen.push_back(p);
  }
  if (chosen.empty() && min_position < n) {
    const int64_t count = std::min(max_rows, n - min_position);
    for (int64_t i = 0; i < count; ++i) {
      chosen.push_back(min_position + i * (n - min_position) / count);
    }
  }
  const auto pos = positions.accessor<int64_t, 1>();
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < pos.size(0); ++r) {
    if (std::binary_search(chosen.begin(), chosen.end(), pos[r])) rows.push_back(r);
  }
  return rows;
}

}  // namespace

std::vector<int32_t> predicted_tokens(const torch::Tensor& logits) {
  const auto argmax = logits.argmax(-1).to(torch::kCPU, torch::kInt32).contiguous();
  return std::vector<int32_t>(argmax.data_ptr<int32_t>(),
                              argmax.data_ptr<int32_t>() + argmax.numel());
}

IndexerRecall indexer_recall(const std::vector<LayerProbe>& probes, const torch::Tensor& targets,
                             const torch::Tensor& positions, const ModelConfig& config,
                             int64_t max_rows) {
  torch::NoGradGuard no_grad;
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_dim_qk));
  const auto targets_cpu = targets.to(torch::kCPU, torch::kInt64);
  const auto positions_cpu = positions.to(torch::kCPU, torch::kInt64).contiguous();
  const auto pos = positions_cpu.accessor<int64_t, 1>();
  IndexerRecall recall;
  for (const auto& probe : probes) {
    const auto indices = probe.indices.to(torch::kCPU);
    const auto kept = probe.rows.to(torch::kCPU, torch::kInt64).contiguous();
    const int64_t* kept_begin = kept.data_ptr<int64_t>();
    const int64_t* kept_end = kept_begin + kept.numel();
    for (int64_t b = 0; b < probe.q.size(0); ++b) {
      // Rows seeing at most topk keys select all of them: recall 1 by construction, skipped.
      for (int64_t row : sample_rows(targets_cpu, positions_cpu, b, config.topk, max_rows)) {
        const int64_t* at = std::lower_bound(kept_begin, kept_end, row);
        TORCH_CHECK(at != kept_end && *at == row, "indexer_recall: the probes lack row ", row);
        const int64_t j = at - kept_begin;
        const auto keys = probe.key[b].narrow(0, 0, pos[row] + 1);           // [t+1, D]
        const auto logits = torch::matmul(probe.q[b][j], keys.t()) * scale;  // [H, t+1]
        const auto mass = torch::softmax(logits, -1).sum(0);
        const auto dense = std::get<1>(mass.topk(config.topk)).to(torch::kCPU);
        const auto chosen = indices[b][j].to(torch::kCPU, torch::kInt64);
        recall.total += torch::isin(dense, chosen).sum().item<double>() / config.topk;
        ++recall.rows;
      }
    }
  }
  return recall;
}

torch::Tensor recall_rows(const torch::Tensor& targets, const torch::Tensor& positions,
                          const ModelConfig& config, int64_t max_rows) {
  const auto targets_cpu = targets.to(torch::kCPU, torch::kInt64);
  const auto positions_cpu = positions.to(torch::kCPU, torch::kInt64).contiguous();
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < targets_cpu.size(0); ++b) {
    for (int64_t row : sample_rows(targets_cpu, positions_cpu, b, config.topk, max_rows)) {
      rows.push_back(row);
    }
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return torch::tensor(rows, torch::kLong);
}

}  // namespace hyscale::trainer
