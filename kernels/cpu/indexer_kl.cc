// CPU indexer KL loss over the selected set and its gradient. A slot is valid when its score is
// not -infinity (unused slots of a selection carry -infinity).
#include "kernels/indexer_kl.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 64;

template <typename T>
bool is_valid(T score) {
  return score != -std::numeric_limits<T>::infinity();
}

// Stable log-sum-exp of a row's valid scores; -infinity when it has none.
template <typename T>
T row_logsumexp(const T* score, int64_t topk) {
  T max_score = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < topk; ++i) max_score = std::max(max_score, score[i]);
  if (!is_valid(max_score)) return max_score;
  T sum = 0;
  for (int64_t i = 0; i < topk; ++i) sum += std::exp(score[i] - max_score);  // exp(-inf) = 0
  return max_score + std::log(sum);
}

}  // namespace

template <typename T>
void indexer_kl_fwd_cpu(int64_t rows, int64_t topk, const T* score, const T* target,
                        const T* score_lse, T* loss, const CpuContext& ctx) {
  cpu::parallel_for(0, rows, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* s = score + r * topk;
      const T* p = target + r * topk;
      const T lse = score_lse ? score_lse[r] : row_logsumexp(s, topk);
      T total = 0;
      for (int64_t i = 0; i < topk; ++i) {
        if (is_valid(s[i]) && p[i] > 0) total += p[i] * (std::log(p[i]) - (s[i] - lse));
      }
      loss[r] = total;
    }
  });
}

template <typename T>
void indexer_kl_bwd_cpu(int64_t rows, int64_t topk, const T* score, const T* target,
                        const T* score_lse, const T* grad_loss, T* grad_score,
                        const CpuContext& ctx) {
  cpu::parallel_for(0, rows, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* s = score + r * topk;
      const T* p = target + r * topk;
      T* g = grad_score + r * topk;
      const T lse = score_lse ? score_lse[r] : row_logsumexp(s, topk);
      for (int64_t i = 0; i < topk; ++i) {
        g[i] = is_valid(s[i]) ? grad_loss[r] * (std::exp(s[i] - lse) - p[i]) : T(0);
      }
    }
  });
}

#define HYSCALE_INSTANTIATE(T)                                                                  \
  template void indexer_kl_fwd_cpu<T>(int64_t, int64_t, const T*, const T*, const T*, T*,       \
                                      const CpuContext&);                                       \
  template void indexer_kl_bwd_cpu<T>(int64_t, int64_t, const T*, const T*, const T*, const T*, \
                                      T*, const CpuContext&);
HYSCALE_INSTANTIATE(float)
HYSCALE_INSTANTIATE(double)
#undef HYSCALE_INSTANTIATE

}  // namespace hyscale
