// CPU sparse MQA attention over selected keys: forward, backward and the indexer's target.
//
// All heads of a query read the same selected keys and values, so a row gathers each selected
// key once into a tile that serves every head, and walks the selected values slot by slot,
// updating every head from each value row while it is in cache.
//
// Backward in two phases. Per row (parallel over rows): p and ds = p * (dp - D) for every
// (head, slot), kept for phase two, and dq. Per key (parallel over keys, through the CSR
// inversion): dkey and dvalue from the entries that selected the key, in (row, slot) order, so
// the result does not depend on the thread count.
#include "kernels/sparse_attn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/index_inversion.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_tile.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 4;
constexpr int64_t kKeysPerChunk = 64;

template <typename T>
constexpr T kMinusInf = -std::numeric_limits<T>::infinity();

// Dot products of a row's vectors x[h] (h < heads, stride dim) with the rows of `matrix` it
// selected: out[h * topk + i] = x[h] . matrix[idx_row[i]], 0 in unused slots.
template <typename T>
void dots_at_selected(const T* x, int64_t heads, const T* matrix, const int32_t* idx_row,
                      int64_t topk, cpu::RowTile<T>& tile, T* out) {
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  T dots[kTile];
  for (int64_t first = 0; first < topk; first += kTile) {
    const int64_t count = std::min(kTile, topk - first);
    tile.load_rows(matrix, idx_row + first, count);
    for (int64_t h = 0; h < heads; ++h) {
      tile.dots(x + h * tile.dim(), dots);
      std::copy(dots, dots + count, out + h * topk + first);
    }
  }
}

// The transpose of dots_at_selected: out[h] = sum_i weights[h * topk + i] * matrix[idx_row[i]]
// over the used slots, for h < heads (rows of `dim`).
template <typename T>
void sum_selected_rows(const T* weights, int64_t heads, const T* matrix, int64_t dim,
                       const int32_t* idx_row, int64_t topk, T* out) {
  std::fill(out, out + heads * dim, T(0));
  for (int64_t i = 0; i < topk; ++i) {
    if (idx_row[i] < 0) continue;
    const T* row = matrix + idx_row[i] * dim;
    for (int64_t h = 0; h < heads; ++h) cpu::axpy(weights[h * topk + i], row, out + h * dim, dim);
  }
}

// Scaled logits of one query row: logits[h * topk + i] = scale * q[t, h] . key[indices[t, i]],
// -infinity in unused slots.
template <typename T>
void row_logits(const SparseAttnShape& s, const T* q_row, const T* key, const int32_t* idx_row,
                T scale, cpu::RowTile<T>& keys, T* logits) {
  dots_at_selected(q_row, s.heads, key, idx_row, s.topk, keys, logits);
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t i = 0; i < s.topk; ++i) {
      T& l = logits[h * s.topk + i];
      l = idx_row[i] < 0 ? kMinusInf<T> : scale * l;
    }
  }
}

// p = exp(logit - lse): 0 in unused slots (logit -inf) and in rows without any (lse -inf).
template <typename T>
T probability(T logit, T lse) {
  return lse == kMinusInf<T> ? T(0) : std::exp(logit - lse);
}

template <typename T>
void scale_in_place(T* x, int64_t n, T factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

// Calls on_row(t, idx_row, logits) for every query row t, in parallel, with the row's selections
// and its scaled logits (as row_logits) in a buffer the call may overwrite.
template <typename T, typename OnRow>
void for_each_row_logits(const SparseAttnShape& s, const T* q, const T* key, const int32_t* indices,
                         T scale, const CpuContext& ctx, OnRow on_row) {
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(s.dim_qk);
    std::vector<T> logits(s.heads * s.topk);
    for (int64_t t = lo; t < hi; ++t) {
      const int32_t* idx_row = indices + t * s.topk;
      row_logits(s, q + t * s.heads * s.dim_qk, key, idx_row, scale, keys, logits.data());
      on_row(t, idx_row, logits.data());
    }
  });
}

}  // namespace

template <typename T>
void sparse_attn_fwd_cpu(const SparseAttnShape& s, const T* q, const T* key, const T* value,
                         const int32_t* indices, T scale, T* out, T* lse, const CpuContext& ctx) {
  s.validate();
  const auto attend = [&](int64_t t, const int32_t* idx_row, T* probs) {
    // Stable softmax per head: subtract the row maximum before exp.
    for (int64_t h = 0; h < s.heads; ++h) {
      T* p = probs + h * s.topk;
      const T max_logit = *std::max_element(p, p + s.topk);
      if (max_logit == kMinusInf<T>) {  // no valid slot
        std::fill(p, p + s.topk, T(0));
        lse[t * s.heads + h] = kMinusInf<T>;
        continue;
      }
      T sum = 0;
      for (int64_t i = 0; i < s.topk; ++i) sum += p[i] = std::exp(p[i] - max_logit);
      scale_in_place(p, s.topk, T(1) / sum);
      lse[t * s.heads + h] = max_logit + std::log(sum);
    }
    sum_selected_rows(probs, s.heads, value, s.dim_v, idx_row, s.topk, out + t * s.heads * s.dim_v);
  };
  for_each_row_logits(s, q, key, indices, scale, ctx, attend);
}

template <typename T>
void sparse_attn_bwd_cpu(const SparseAttnShape& s, const T* q, const T* key, const T* value,
                         const int32_t* indices, T scale, const T* out, const T* lse,
                         const T* grad_out, T* grad_q, T* grad_key, T* grad_value,
                         const CpuContext& ctx) {
  s.validate();
  const cpu::KeySelections selections(indices, s.num_queries, s.topk, s.num_keys);
  const int64_t per_row = s.heads * s.topk;
  std::vector<T> probs(s.num_queries * per_row), dlogits(s.num_queries * per_row);

  // Phase 1: p = exp(scale * q.k - lse), dp = dO . v, ds = p * (dp - D) with D = dO . O,
  // dq = scale * sum_i ds_i * key_i.
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(s.dim_qk), values(s.dim_v);
    for (int64_t t = lo; t < hi; ++t) {
      const int32_t* idx_row = indices + t * s.topk;
      const T* d_out = grad_out + t * s.heads * s.dim_v;
      T* p = probs.data() + t * per_row;
      T* ds = dlogits.data() + t * per_row;
      row_logits(s, q + t * s.heads * s.dim_qk, key, idx_row, scale, keys, p);
      dots_at_selected(d_out, s.heads, value, idx_row, s.topk, values, ds);
      for (int64_t h = 0; h < s.heads; ++h) {
        const T* o = out + (t * s.heads + h) * s.dim_v;
        T d = 0;
        for (int64_t c = 0; c < s.dim_v; ++c) d += d_out[h * s.dim_v + c] * o[c];
        for (int64_t i = 0; i < s.topk; ++i) {
          const int64_t j = h * s.topk + i;
          p[j] = probability(p[j], lse[t * s.heads + h]);
          ds[j] = p[j] * (ds[j] - d);
        }
      }
      T* gq = grad_q + t * s.heads * s.dim_qk;
      sum_selected_rows(ds, s.heads, key, s.dim_qk, idx_row, s.topk, gq);
      scale_in_place(gq, s.heads * s.dim_qk, scale);
    }
  });

  // Phase 2: dkey[s] = scale * sum ds * q[t, h], dvalue[s] = sum p * dO[t, h] over the
  // (row, slot) entries that selected s and every head.
  cpu::parallel_for(0, s.num_keys, kKeysPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      T* gk = grad_key + k * s.dim_qk;
      T* gv = grad_value + k * s.dim_v;
      std::fill(gk, gk + s.dim_qk, T(0));
      std::fill(gv, gv + s.dim_v, T(0));
      for (const int64_t entry : selections.of_key(k)) {
        const int64_t t = entry / s.topk, i = entry % s.topk;
        for (int64_t h = 0; h < s.heads; ++h) {
          const int64_t j = t * per_row + h * s.topk + i;
          cpu::axpy(dlogits[j], q + (t * s.heads + h) * s.dim_qk, gk, s.dim_qk);
          cpu::axpy(probs[j], grad_out + (t * s.heads + h) * s.dim_v, gv, s.dim_v);
        }
      }
      scale_in_place(gk, s.dim_qk, scale);
    }
  });
}

template <typename T>
void selected_attention_mass_cpu(const SparseAttnShape& s, const T* q, const T* key,
                                 const int32_t* indices, const T* lse, T scale, T* mass,
                                 const CpuContext& ctx) {
  s.validate();
  const auto row_mass = [&](int64_t t, const int32_t* idx_row, const T* logits) {
    T* m = mass + t * s.topk;
    T total = 0;
    for (int64_t i = 0; i < s.topk; ++i) {
      m[i] = 0;
      if (idx_row[i] < 0) continue;
      for (int64_t h = 0; h < s.heads; ++h) {
        m[i] += probability(logits[h * s.topk + i], lse[t * s.heads + h]);
      }
      total += m[i];
    }
    if (total > 0) scale_in_place(m, s.topk, T(1) / total);
  };
  for_each_row_logits(s, q, key, indices, scale, ctx, row_mass);
}

#define HYSCALE_INSTANTIATE(T)                                                                  \
  template void sparse_attn_fwd_cpu<T>(const SparseAttnShape&, const T*, const T*, const T*,    \
                                       const int32_t*, T, T*, T*, const CpuContext&);           \
  template void sparse_attn_bwd_cpu<T>(const SparseAttnShape&, const T*, const T*, const T*,    \
                                       const int32_t*, T, const T*, const T*, const T*, T*, T*, \
                                       T*, const CpuContext&);                                  \
  template void selected_attention_mass_cpu<T>(const SparseAttnShape&, const T*, const T*,      \
                                               const int32_t*, const T*, T, T*,                 \
                                               const CpuContext&);
HYSCALE_INSTANTIATE(float)
HYSCALE_INSTANTIATE(double)
#undef HYSCALE_INSTANTIATE

}  // namespace hyscale
