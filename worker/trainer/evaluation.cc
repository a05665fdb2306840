#include "worker/trainer/evaluation.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace hyscale::trainer {
namespace {

// Query rows of sequence b to score: rows with a target if there are any, else evenly spaced.
std::vector<int64_t> sample_rows(const torch::Tensor& targets, int64_t b, int64_t first_row,
                                 int64_t max_rows) {
  const auto row = targets[b];
  const auto row_targets = row.accessor<int64_t, 1>();
  const int64_t t = row_targets.size(0);
  std::vector<int64_t> rows;
  for (int64_t r = first_row; r < t && static_cast<int64_t>(rows.size()) < max_rows; ++r) {
    if (row_targets[r] >= 0) rows.push_back(r);
  }
  if (!rows.empty() || first_row >= t) return rows;
  const int64_t n = std::min(max_rows, t - first_row);
  for (int64_t i = 0; i < n; ++i) rows.push_back(first_row + i * (t - first_row) / n);
  return rows;
}

}  // namespace

std::vector<int32_t> predicted_tokens(const torch::Tensor& logits) {
  const auto argmax = logits.argmax(-1).to(torch::kCPU, torch::kInt32).contiguous();
  return std::vector<int32_t>(argmax.data_ptr<int32_t>(),
                              argmax.data_ptr<int32_t>() + argmax.numel());
}

double indexer_recall(const std::vector<LayerProbe>& probes, const torch::Tensor& targets,
                      const ModelConfig& config, int64_t max_rows) {
  torch::NoGradGuard no_grad;
  const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_dim_qk));
  const auto targets_cpu = targets.to(torch::kCPU, torch::kInt64);
  double total = 0.0;
  int64_t count = 0;
  for (const auto& probe : probes) {
    const auto indices = probe.indices.to(torch::kCPU);
    for (int64_t b = 0; b < probe.q.size(0); ++b) {
      // Rows seeing at most topk keys select all of them: recall 1 by construction, skipped.
      for (int64_t row : sample_rows(targets_cpu, b, config.topk, max_rows)) {
        const auto keys = probe.key[b].narrow(0, 0, row + 1);                  // [t+1, D]
        const auto logits = torch::matmul(probe.q[b][row], keys.t()) * scale;  // [H, t+1]
        const auto mass = torch::softmax(logits, -1).sum(0);
        const auto dense = std::get<1>(mass.topk(config.topk)).to(torch::kCPU);
        const auto chosen = indices[b][row].to(torch::kInt64);
        total += torch::isin(dense, chosen).sum().item<double>() / config.topk;
        ++count;
      }
    }
  }
  return count == 0 ? 1.0 : total / count;
}

}  // namespace hyscale::trainer
