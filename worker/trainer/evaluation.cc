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

// Distinct values of a 1-D tensor.
int64_t distinct_count(const torch::Tensor& values) {
  if (values.numel() == 0) return 0;
  const auto sorted = std::get<0>(values.sort());
  return 1 + sorted.slice(0, 1).ne(sorted.slice(0, 0, -1)).sum().item<int64_t>();
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

KeySharing::KeySharing(int64_t rows) {
  for (int64_t g = 2; g <= rows; g *= 2) groups.push_back(g);
  selected.assign(groups.size(), 0.0);
  distinct.assign(groups.size(), 0.0);
}

torch::Tensor sharing_rows(const torch::Tensor& positions, const ModelConfig& config,
                           int64_t rows) {
  const auto positions_cpu = positions.to(torch::kCPU, torch::kInt64).contiguous();
  const auto pos = positions_cpu.accessor<int64_t, 1>();
  std::vector<int64_t> chosen;  // from the last row back, while positions run consecutively
  for (int64_t r = pos.size(0) - 1; r >= 0 && static_cast<int64_t>(chosen.size()) < rows; --r) {
    if (pos[r] < config.topk) break;  // sees at most topk keys: selects them all
    if (!chosen.empty() && pos[r] + 1 != pos[chosen.back()]) break;
    chosen.push_back(r);
  }
  std::reverse(chosen.begin(), chosen.end());
  return torch::tensor(chosen, torch::kLong);
}

KeySharing key_sharing(const std::vector<LayerProbe>& probes, const torch::Tensor& positions,
                       const ModelConfig& config, int64_t rows) {
  torch::NoGradGuard no_grad;
  const auto wanted = sharing_rows(positions, config, rows);
  const int64_t count = wanted.numel();
  const int64_t* wanted_rows = wanted.data_ptr<int64_t>();
  KeySharing sharing(rows);
  for (const auto& probe : probes) {
    const auto kept = probe.rows.to(torch::kCPU, torch::kInt64).contiguous();
    const int64_t* kept_begin = kept.data_ptr<int64_t>();
    const int64_t* kept_end = kept_begin + kept.numel();
    std::vector<int64_t> at;  // the wanted rows' places among the kept ones
    for (int64_t i = 0; i < count; ++i) {
      const int64_t* found = std::lower_bound(kept_begin, kept_end, wanted_rows[i]);
      TORCH_CHECK(found != kept_end && *found == wanted_rows[i],
                  "key_sharing: the probes lack row ", wanted_rows[i]);
      at.push_back(found - kept_begin);
    }
    const auto places = torch::tensor(at, torch::kLong);
    const auto window = probe.indices.to(torch::kCPU, torch::kInt64).index_select(1, places);
    for (int64_t b = 0; b < window.size(0); ++b) {
      for (size_t i = 0; i < sharing.groups.size(); ++i) {
        const int64_t g = sharing.groups[i];
        for (int64_t first = 0; first + g <= count; first += g) {
          const auto keys = window[b].narrow(0, first, g).reshape(-1);
          const auto valid = keys.masked_select(keys >= 0);
          sharing.selected[i] += static_cast<double>(valid.numel());
          sharing.distinct[i] += static_cast<double>(distinct_count(valid));
        }
      }
    }
  }
  return sharing;
}

}  // namespace hyscale::trainer
