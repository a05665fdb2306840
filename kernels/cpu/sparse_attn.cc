// CPU sparse MQA attention over selected keys: forward, backward and the indexer's target.
// Every head of a query reads the same selected keys, so a row's keys are visited once for all
// heads.
#include "kernels/sparse_attn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/index_inversion.h"
#include "kernels/cpu/parallel.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 8;
constexpr int64_t kKeysPerChunk = 64;

// Scaled logits of one query row: logits[h * topk + i] = scale * q[t, h] . key[indices[t, i]],
// -infinity in unused slots.
template <typename T>
void row_logits(const SparseAttnShape& s, const T* q_row, const T* key, const int32_t* idx_row,
                T scale, T* logits) {
  for (int64_t i = 0; i < s.topk; ++i) {
    const int32_t k = idx_row[i];
    for (int64_t h = 0; h < s.heads; ++h) {
      logits[h * s.topk + i] = k < 0 ? -std::numeric_limits<T>::infinity()
                                     : scale * cpu::dot(q_row + h * s.dim_qk, key + k * s.dim_qk,
                                                        s.dim_qk);
    }
  }
}

// p = exp(logit - lse) (0 in unused slots, and everywhere when the row has no key).
template <typename T>
T probability(T logit, T lse) {
  return std::isinf(lse) ? T(0) : std::exp(logit - lse);
}

}  // namespace

template <typename T>
void sparse_attn_fwd_cpu(const SparseAttnShape& s, const T* q, const T* key, const T* value,
                         const int32_t* indices, T scale, T* out, T* lse, const CpuContext& ctx) {
  s.validate();
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    std::vector<T> logits(s.heads * s.topk);
    for (int64_t t = lo; t < hi; ++t) {
      const int32_t* idx_row = indices + t * s.topk;
      row_logits(s, q + t * s.heads * s.dim_qk, key, idx_row, scale, logits.data());
      for (int64_t h = 0; h < s.heads; ++h) {
        const T* l = logits.data() + h * s.topk;
        T* o = out + (t * s.heads + h) * s.dim_v;
        std::fill(o, o + s.dim_v, T(0));
        const T m = *std::max_element(l, l + s.topk);
        if (std::isinf(m)) {  // no valid slot
          lse[t * s.heads + h] = -std::numeric_limits<T>::infinity();
          continue;
        }
        T sum = 0;
        for (int64_t i = 0; i < s.topk; ++i) {
          if (idx_row[i] < 0) continue;
          const T p = std::exp(l[i] - m);
          sum += p;
          cpu::axpy(p, value + idx_row[i] * s.dim_v, o, s.dim_v);
        }
        for (int64_t d = 0; d < s.dim_v; ++d) o[d] /= sum;
        lse[t * s.heads + h] = m + std::log(sum);
      }
    }
  });
}

template <typename T>
void sparse_attn_bwd_cpu(const SparseAttnShape& s, const T* q, const T* key, const T* value,
                         const int32_t* indices, T scale, const T* out, const T* lse,
                         const T* grad_out, T* grad_q, T* grad_key, T* grad_value,
                         const CpuContext& ctx) {
  s.validate();
  // Phase 1, per row: probabilities p and logit gradients ds = p * (dO.v - dO.O), and dq.
  const int64_t per_row = s.heads * s.topk;
  std::vector<T> probs(s.num_queries * per_row), dlogits(s.num_queries * per_row);
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int32_t* idx_row = indices + t * s.topk;
      T* p = probs.data() + t * per_row;
      T* ds = dlogits.data() + t * per_row;
      row_logits(s, q + t * s.heads * s.dim_qk, key, idx_row, scale, p);
      T* gq = grad_q + t * s.heads * s.dim_qk;
      std::fill(gq, gq + s.heads * s.dim_qk, T(0));
      for (int64_t h = 0; h < s.heads; ++h) {
        const T* d_out = grad_out + (t * s.heads + h) * s.dim_v;
        const T row_dot = cpu::dot(d_out, out + (t * s.heads + h) * s.dim_v, s.dim_v);
        for (int64_t i = 0; i < s.topk; ++i) {
          const int64_t j = h * s.topk + i;
          if (idx_row[i] < 0) {
            p[j] = ds[j] = 0;
            continue;
          }
          p[j] = probability(p[j], lse[t * s.heads + h]);
          ds[j] = p[j] * (cpu::dot(d_out, value + idx_row[i] * s.dim_v, s.dim_v) - row_dot);
          cpu::axpy(scale * ds[j], key + idx_row[i] * s.dim_qk, gq + h * s.dim_qk, s.dim_qk);
        }
      }
    }
  });
  // Phase 2, per key, over the entries that selected it in (row, slot) order:
  // dkey[s] = scale * sum ds * q[t, h],  dvalue[s] = sum p * dO[t, h].
  const cpu::KeyToEntries by_key(indices, s.num_queries, s.topk, s.num_keys);
  cpu::parallel_for(0, s.num_keys, kKeysPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      T* gk = grad_key + k * s.dim_qk;
      T* gv = grad_value + k * s.dim_v;
      std::fill(gk, gk + s.dim_qk, T(0));
      std::fill(gv, gv + s.dim_v, T(0));
      for (int64_t e = by_key.offsets[k]; e < by_key.offsets[k + 1]; ++e) {
        const int64_t entry = by_key.entries[e], t = entry / s.topk, i = entry % s.topk;
        for (int64_t h = 0; h < s.heads; ++h) {
          const int64_t j = t * per_row + h * s.topk + i;
          cpu::axpy(scale * dlogits[j], q + (t * s.heads + h) * s.dim_qk, gk, s.dim_qk);
          cpu::axpy(probs[j], grad_out + (t * s.heads + h) * s.dim_v, gv, s.dim_v);
        }
      }
    }
  });
}

template <typename T>
void selected_attention_mass_cpu(const SparseAttnShape& s, const T* q, const T* key,
                                 const int32_t* indices, const T* lse, T scale, T* mass,
                                 const CpuContext& ctx) {
  s.validate();
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    std::vector<T> logits(s.heads * s.topk);
    for (int64_t t = lo; t < hi; ++t) {
      row_logits(s, q + t * s.heads * s.dim_qk, key, indices + t * s.topk, scale, logits.data());
      T* m = mass + t * s.topk;
      T total = 0;
      for (int64_t i = 0; i < s.topk; ++i) {
        m[i] = 0;
        if (indices[t * s.topk + i] < 0) continue;
        for (int64_t h = 0; h < s.heads; ++h) {
          m[i] += probability(logits[h * s.topk + i], lse[t * s.heads + h]);
        }
        total += m[i];
      }
      if (total > 0) {
        for (int64_t i = 0; i < s.topk; ++i) m[i] /= total;
      }
    }
  });
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
