// The dense warm-up stage's indexer loss (DESIGN.md section 2) without an [N, M] table. Per query
// row t, over every key s visible to it (the indexer's visibility and q_offset, for both):
//   target  p[t, s] = (1/H) sum_h exp(scale * q[t, h] . key[s] - lse[t, h])
//   loss    [t]     = KL(p[t] || softmax(I[t])) = sum_s p (log p - (I[t, s] - index_lse[t]))
// with I the lightning-indexer score (kernels/shapes.h, IndexerShape). p is the frozen main
// attention's distribution summed over heads and L1-normalised: every head sums to 1, so the sum
// is H, as the model's dense path divides. A row without a visible key has lse and index_lse
// -infinity, loss 0 and zero gradient.
//
// Three kernels, as the GPU runs them: the two log-sum-exps, then a pass over key tiles forming
// p, the KL and its gradient with respect to the scores, accumulating the indexer's gradients.
#pragma once

#include <cstdint>

#include "kernels/shapes.h"

namespace hyscale {

// lse [N, H]: log sum_s exp(scale * q[t, h] . key[s]) over the visible keys.
template <typename T>
void dense_attention_lse_cpu(const DenseIndexerShape& shape, const T* q, const T* key, T scale,
                             T* lse, const CpuContext& ctx);

// index_lse [N]: log sum_s exp(I[t, s]) over the visible keys; index_q [N, H_I, d_I],
// index_k [M, d_I], index_w [N, H_I] as IndexerShape describes.
template <typename T>
void dense_index_lse_cpu(const IndexerShape& shape, const T* index_q, const T* index_k,
                         const T* index_w, T* index_lse, const CpuContext& ctx);

// loss [N], and the gradients of sum(loss) with respect to the indexer's inputs (overwritten):
// grad_q [N, H_I, d_I], grad_k [M, d_I], grad_w [N, H_I]. The target is a constant (the main
// attention is frozen). ReLU's derivative at 0 is taken as 0. Every sum runs in a fixed order:
// the results are bit-identical for any thread count.
template <typename T>
void dense_indexer_kl_cpu(const DenseIndexerShape& shape, const T* q, const T* key, T scale,
                          const T* lse, const T* index_q, const T* index_k, const T* index_w,
                          const T* index_lse, T* loss, T* grad_q, T* grad_k, T* grad_w,
                          const CpuContext& ctx);

}  // namespace hyscale
