// CPU indexer KL loss over the selected set and its gradient.
#include "kernels/indexer_kl.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 64;

// log-sum-exp of the finite scores of a row; -infinity when there are none.
template <typename T>
T row_lse(const T* score, int64_t topk) {
  const T m = *std::max_element(score, score + topk);
  if (std::isinf(m)) return m;
  T sum = 0;
  for (int64_t i = 0; i < topk; ++i) sum += std::isinf(score[i]) ? T(0) : std::exp(score[i] - m);
  return m + std::log(sum);
}

}  // namespace

template <typename T>
void indexer_kl_fwd_cpu(int64_t rows, int64_t topk, const T* score, const T* target, T* loss,
                        const CpuContext& ctx) {
  cpu::parallel_for(0, rows, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* s = score + r * topk;
      const T* p = target + r * topk;
      const T lse = row_lse(s, topk);
      T total = 0;
      for (int64_t i = 0; i < topk; ++i) {
        if (std::isinf(s[i]) || p[i] <= 0) continue;  // 0 * log 0 = 0; unused slot
        total += p[i] * (std::log(p[i]) - (s[i] - lse));
      }
      loss[r] = total;
    }
  });
}

template <typename T>
void indexer_kl_bwd_cpu(int64_t rows, int64_t topk, const T* score, const T* target,
                        const T* grad_loss, T* grad_score, const CpuContext& ctx) {
  cpu::parallel_for(0, rows, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* s = score + r * topk;
      const T* p = target + r * topk;
      T* g = grad_score + r * topk;
      const T lse = row_lse(s, topk);
      for (int64_t i = 0; i < topk; ++i) {
        g[i] = std::isinf(s[i]) ? T(0) : grad_loss[r] * (std::exp(s[i] - lse) - p[i]);
      }
    }
  });
}

template void indexer_kl_fwd_cpu<float>(int64_t, int64_t, const float*, const float*, float*,
                                        const CpuContext&);
template void indexer_kl_fwd_cpu<double>(int64_t, int64_t, const double*, const double*, double*,
                                         const CpuContext&);
template void indexer_kl_bwd_cpu<float>(int64_t, int64_t, const float*, const float*,
                                        const float*, float*, const CpuContext&);
template void indexer_kl_bwd_cpu<double>(int64_t, int64_t, const double*, const double*,
                                         const double*, double*, const CpuContext&);

}  // namespace hyscale
