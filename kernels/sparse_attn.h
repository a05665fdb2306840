// Sparse MQA attention over selected keys: H query heads share one key/value per token.
//   o[t, h] = sum_{i} softmax_i(scale * q[t, h] . key[indices[t, i]]) * value[indices[t, i]]
// Slots with index -1 are skipped; a row with no valid slot gets o = 0 and lse = -infinity.
#pragma once

#include <cstdint>

#include "kernels/shapes.h"

namespace hyscale {

// out [N, H, d_v], lse [N, H] (natural-log sum of exp of the scaled logits).
template <typename T>
void sparse_attn_fwd_cpu(const SparseAttnShape& shape, const T* q, const T* key, const T* value,
                         const int32_t* indices, T scale, T* out, T* lse, const CpuContext& ctx);

// Writes (overwrites) grad_q [N, H, d_qk], grad_key [M, d_qk], grad_value [M, d_v].
// grad_key / grad_value sum over queries in a fixed order: deterministic for any thread count.
template <typename T>
void sparse_attn_bwd_cpu(const SparseAttnShape& shape, const T* q, const T* key, const T* value,
                         const int32_t* indices, T scale, const T* out, const T* lse,
                         const T* grad_out, T* grad_q, T* grad_key, T* grad_value,
                         const CpuContext& ctx);

// The indexer's sparse-stage target: main-attention probabilities at the selected keys, summed
// over heads and L1-normalised per row: mass [N, topk], 0 in slots with index -1. Computed from
// q, key and lse, so no [N, M] table is needed.
template <typename T>
void selected_attention_mass_cpu(const SparseAttnShape& shape, const T* q, const T* key,
                                 const int32_t* indices, const T* lse, T scale, T* mass,
                                 const CpuContext& ctx);

}  // namespace hyscale
