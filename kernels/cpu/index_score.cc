// CPU index scores at selected entries (selection replay) and their backward.
#include "kernels/index_score.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/index_inversion.h"
#include "kernels/cpu/index_score_row.h"
#include "kernels/cpu/parallel.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 16;
constexpr int64_t kKeysPerChunk = 64;

}  // namespace

void validate_indices(const IndexerShape& shape, const int32_t* indices, int64_t topk) {
  shape.validate();
  for (int64_t row = 0; row < shape.num_queries; ++row) {
    const int64_t visible = shape.visible_keys(row);
    for (int64_t i = 0; i < topk; ++i) {
      const int64_t s = indices[row * topk + i];
      if (s != -1 && (s < 0 || s >= visible)) {
        throw std::invalid_argument("indices[" + std::to_string(row) + ", " + std::to_string(i) +
                                    "] = " + std::to_string(s) + " is not a key visible to row " +
                                    std::to_string(row) + " (visible: 0.." +
                                    std::to_string(visible - 1) + ", or -1)");
      }
    }
  }
}

template <typename T>
void index_score_gather_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w,
                            const int32_t* indices, int64_t topk, T* scores,
                            const CpuContext& ctx) {
  shape.validate();
  const int64_t heads = shape.heads, dim = shape.dim;
  cpu::parallel_for(0, shape.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      for (int64_t i = 0; i < topk; ++i) {
        const int32_t s = indices[row * topk + i];
        scores[row * topk + i] =
            s < 0 ? -std::numeric_limits<T>::infinity()
                  : cpu::index_score(q + row * heads * dim, k + s * dim, w + row * heads, heads, dim);
      }
    }
  });
}

template <typename T>
void index_score_backward_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w,
                              const int32_t* indices, int64_t topk, const T* grad_scores,
                              T* grad_q, T* grad_k, T* grad_w, const CpuContext& ctx) {
  shape.validate();
  const int64_t heads = shape.heads, dim = shape.dim;
  // Per row: grad_q[t, j] = sum_i g[t, i] * w[t, j] * [q[t, j].k[s_i] > 0] * k[s_i] and
  // grad_w[t, j] = sum_i g[t, i] * ReLU(q[t, j].k[s_i]).
  cpu::parallel_for(0, shape.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      T* gq = grad_q + row * heads * dim;
      T* gw = grad_w + row * heads;
      std::fill(gq, gq + heads * dim, T(0));
      std::fill(gw, gw + heads, T(0));
      for (int64_t i = 0; i < topk; ++i) {
        const int32_t s = indices[row * topk + i];
        const T g = grad_scores[row * topk + i];
        if (s < 0 || g == T(0)) continue;
        for (int64_t j = 0; j < heads; ++j) {
          const T d = cpu::dot(q + (row * heads + j) * dim, k + s * dim, dim);
          if (d <= 0) continue;
          gw[j] += g * d;
          cpu::axpy(g * w[row * heads + j], k + s * dim, gq + j * dim, dim);
        }
      }
    }
  });
  // Per key, over the entries that selected it in (row, slot) order:
  // grad_k[s] = sum g[t, i] * sum_j w[t, j] * [q[t, j].k[s] > 0] * q[t, j].
  const cpu::KeyToEntries by_key(indices, shape.num_queries, topk, shape.num_keys);
  cpu::parallel_for(0, shape.num_keys, kKeysPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      T* gk = grad_k + s * dim;
      std::fill(gk, gk + dim, T(0));
      for (int64_t e = by_key.offsets[s]; e < by_key.offsets[s + 1]; ++e) {
        const int64_t entry = by_key.entries[e], row = entry / topk;
        const T g = grad_scores[entry];
        if (g == T(0)) continue;
        for (int64_t j = 0; j < heads; ++j) {
          const T* q_head = q + (row * heads + j) * dim;
          if (cpu::dot(q_head, k + s * dim, dim) > 0) cpu::axpy(g * w[row * heads + j], q_head, gk, dim);
        }
      }
    }
  });
}

#define HYSCALE_INSTANTIATE(T)                                                                   \
  template void index_score_gather_cpu<T>(const IndexerShape&, const T*, const T*, const T*,   \
                                          const int32_t*, int64_t, T*, const CpuContext&);     \
  template void index_score_backward_cpu<T>(const IndexerShape&, const T*, const T*, const T*, \
                                            const int32_t*, int64_t, const T*, T*, T*, T*,     \
                                            const CpuContext&);
HYSCALE_INSTANTIATE(float)
HYSCALE_INSTANTIATE(double)
#undef HYSCALE_INSTANTIATE

}  // namespace hyscale
