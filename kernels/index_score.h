// Index scores at given entries: the selection-replay path. Recomputes I[t, s] only at the
// selected s = indices[t, i] (O(N * topk * H_I * d_I)), and its backward.
#pragma once

#include <cstdint>

#include "kernels/shapes.h"

namespace hyscale {

// Throws std::invalid_argument unless every entry of indices [N, topk] is -1 or a key visible to
// its row (duplicates are allowed here; flash_topk never produces them).
void validate_indices(const IndexerShape& shape, const int32_t* indices, int64_t topk);

// scores[t, i] = I[t, indices[t, i]]; -infinity where indices[t, i] == -1.
template <typename T>
void index_score_gather_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w,
                            const int32_t* indices, int64_t topk, T* scores, const CpuContext& ctx);

// Given grad_scores [N, topk], writes (overwrites) grad_q [N, H_I, d_I], grad_k [M, d_I] and
// grad_w [N, H_I]. ReLU's derivative at 0 is taken as 0. Slots with index -1 contribute nothing.
// grad_k sums over queries in a fixed order: deterministic for any thread count.
template <typename T>
void index_score_backward_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w,
                              const int32_t* indices, int64_t topk, const T* grad_scores, T* grad_q,
                              T* grad_k, T* grad_w, const CpuContext& ctx);

}  // namespace hyscale
