#include "worker/calibrate/selection.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <random>
#include <vector>

namespace hyscale::calibrate {

at::Tensor LocalSelection(int64_t n, int64_t topk, uint64_t seed) {
  at::Tensor out = at::empty({n, topk}, at::kInt);
  int32_t* rows = out.data_ptr<int32_t>();
  const int64_t half = topk / 2, parts = topk - half;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::vector<double> draws(parts);
  for (int64_t t = 0; t < n; ++t) {
    int32_t* row = rows + t * topk;
    if (t + 1 <= topk) {
      for (int64_t i = 0; i < topk; ++i) row[i] = i <= t ? static_cast<int32_t>(i) : -1;
      continue;
    }
    if (t % 16 == 0 || t == topk) {
      for (double& u : draws) u = uniform(rng);
    }
    for (int64_t i = 0; i < half; ++i) row[i] = static_cast<int32_t>(t - i);
    const int64_t width = t + 1 - half;  // keys 0 .. t - half, width >= parts
    for (int64_t j = 0; j < parts; ++j) {
      const int64_t lo = j * width / parts, hi = (j + 1) * width / parts;
      const int64_t pick = std::min(static_cast<int64_t>(draws[j] * (hi - lo)), hi - lo - 1);
      row[half + j] = static_cast<int32_t>(lo + pick);
    }
  }
  return out;
}

double DedupFactor(const at::Tensor& indices, int64_t group) {
  if (group == 1) return 1;
  const int64_t n = indices.size(0), k = indices.size(1);
  const int64_t pad = (group - n % group) % group;
  const at::Tensor padded = at::cat({indices, at::full({pad, k}, -1, indices.options())});
  const at::Tensor groups = padded.view({-1, group * k});
  int64_t valid = 0, unions = 0;
  for (const at::Tensor& part : groups.split(1024)) {
    const at::Tensor sorted = std::get<0>(part.sort(1));
    // An entry starts a run of equal keys: the first of its row, or unlike its left neighbour.
    const at::Tensor first =
        at::cat({at::ones({sorted.size(0), 1}, sorted.options().dtype(at::kBool)),
                 sorted.slice(1, 1).ne(sorted.slice(1, 0, -1))},
                1);
    unions += first.logical_and(sorted.ge(0)).sum().item<int64_t>();
    valid += part.ge(0).sum().item<int64_t>();
  }
  return static_cast<double>(valid) / static_cast<double>(std::max<int64_t>(unions, 1));
}

}  // namespace hyscale::calibrate
