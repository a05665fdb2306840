// Indexer loss on the selected set: per row, KL(target || softmax(score)) over the valid slots.
// score [rows, topk] (-infinity in unused slots), target [rows, topk] (non-negative, sums to 1 over
// the valid slots, 0 elsewhere). Rows without a valid slot have loss 0 and zero gradient.
#pragma once

#include <cstdint>

#include "kernels/shapes.h"

namespace hyscale {

// The softmax's normalizer, log sum_i exp(score_i) over a row's valid slots, is each row's
// score_lse [rows] where given (the forward's, when the scores are formed again later: the same
// scores give the same value), computed from the scores where null.

// loss [rows]: sum_i target_i * (log target_i - log_softmax(score)_i), with 0 * log 0 = 0.
template <typename T>
void indexer_kl_fwd_cpu(int64_t rows, int64_t topk, const T* score, const T* target,
                        const T* score_lse, T* loss, const CpuContext& ctx);

// grad_score [rows, topk] = grad_loss[row] * (softmax(score) - target) on valid slots, 0 elsewhere.
// The target is treated as a constant (it is detached in the model).
template <typename T>
void indexer_kl_bwd_cpu(int64_t rows, int64_t topk, const T* score, const T* target,
                        const T* score_lse, const T* grad_loss, T* grad_score,
                        const CpuContext& ctx);

}  // namespace hyscale
