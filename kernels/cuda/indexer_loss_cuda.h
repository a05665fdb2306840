// CUDA kernels of the indexer's training path: the backward of the index scores at selected keys
// (selection replay) and the KL loss between the indexer's scores and its target, forward and
// backward. The target (the main-attention mass at the selected keys) is computed in
// kernels/torch/cuda.cc, on tensor cores through cuBLAS; the dense warm-up's here, from q and key
// tiles (dense_target.cu) or from logits made there.
//
// Host API over raw device pointers, so this header needs neither libtorch nor CUDA headers; the
// torch binding (kernels/torch/cuda.cc) checks shapes and calls it. All tensors are contiguous on
// one device. The contracts are kernels/index_score.h, kernels/sparse_attn.h
// (selected_attention_mass_cpu) and kernels/indexer_kl.h; docs/sparse_attn.md ("The indexer's
// loss on the GPU") explains the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/shapes.h"

namespace hyscale::cuda {

using Stream = void*;  // cudaStream_t

// q [N, H_I, d_I] and k [M, d_I] bf16, w [N, H_I] fp32 (shapes cuda_indexer_shape_supported
// takes), indices [N, topk] int32 (-1 or in [0, M)), grad_scores [N, topk] fp32. Writes
// (overwrites) grad_q [N, H_I, d_I] (bf16 when grad_q_bf16, else fp32), grad_k [M, d_I] and
// grad_w [N, H_I], fp32. ReLU's derivative at 0 is 0. Tensor cores, sm_90a. grad_k sums over
// queries with fp32 reductions (the order of additions varies run to run) or, when
// `deterministic`, in 64-bit fixed point (the same bits every run; docs/sparse_attn.md gives its
// resolution). workspace:
// index_score_backward_workspace_bytes(shape, deterministic) bytes.
size_t index_score_backward_workspace_bytes(const IndexerShape& shape, bool deterministic);
void index_score_backward(const IndexerShape& shape, const void* q, const void* k, const float* w,
                          const int32_t* indices, int64_t topk, const float* grad_scores,
                          bool deterministic, void* grad_q, bool grad_q_bf16, float* grad_k,
                          float* grad_w, void* workspace, Stream stream);

// index_score_backward with the gates' gradients formed in its tiles from the KL on the
// selection (kernels/indexer_kl.h): target [N, topk] fp32 in place of grad_scores, score_lse and
// grad_loss [N] fp32; g_i = grad_loss (exp(s_i - score_lse) - target_i) on valid slots from the
// index scores s_i its products give, and each row's KL, sum_i target_i (log target_i - s_i +
// score_lse), into loss [N]. No scores or gradients of the selection exist outside the kernel.
// workspace: index_score_backward_workspace_bytes(shape, deterministic) bytes.
void indexer_loss_backward(const IndexerShape& shape, const void* q, const void* k, const float* w,
                           const int32_t* indices, int64_t topk, const float* target,
                           const float* score_lse, const float* grad_loss, bool deterministic,
                           float* loss, void* grad_q, bool grad_q_bf16, float* grad_k,
                           float* grad_w, void* workspace, Stream stream);

// The dense warm-up's indexer gradients of a block of rows (dense_indexer_kl): shape.num_queries
// rows at positions q_offset.., each seeing its causal prefix of shape.num_keys keys
// (shape.visible_keys); q [rows, H_I, d_I] and w [rows, H_I] of the block, k [num_keys, d_I]
// bf16, grad_scores [rows, num_keys] fp32 by key (0 where a row does not see the key) and gates
// [rows, num_keys], the ReLU gates' head bits index_score_table wrote for the same rows and keys
// (no product of q and k is computed again), both with rows table_stride elements apart (a
// multiple of 4 and 16-byte aligned, for the TMA unit, which copies them in boxes). Writes grad_q
// and grad_w of the block and adds into grad_k [num_keys, d_I]: grad_q and grad_w query-major
// (three rows a block sharing each key tile of their prefixes), grad_k key-major (a block three
// 64-key tiles sharing each row's q, or one tile with its rows split three ways and summed in a
// fixed order; HYSCALE_DENSE_KEY_GRAD=share or split forces one). No reductions: the same bits
// every run of a shape on a device and setting (the SM count picks the form and dense_indexer_kl's
// blocks of rows).
void dense_index_score_backward(const IndexerShape& shape, const void* q, const void* k,
                                const float* w, const float* grad_scores, const uint64_t* gates,
                                int64_t table_stride, float* grad_q, float* grad_k, float* grad_w,
                                Stream stream);
// The rows of dense_index_score_backward resident at once on the current device (three a block):
// blocks of rows a multiple of it leave no wave of the query-major kernel part empty.
int64_t dense_index_score_backward_rows_per_wave(int64_t heads, int64_t dim);

// score, target [rows, topk] fp32 (score -infinity in unused slots). loss [rows] =
// KL(target || softmax(score)) over the valid slots; grad_score [rows, topk] =
// grad_loss[row] * (softmax(score) - target) on valid slots, 0 elsewhere.
void indexer_kl_fwd(int64_t rows, int64_t topk, const float* score, const float* target,
                    float* loss, Stream stream);
void indexer_kl_bwd(int64_t rows, int64_t topk, const float* score, const float* target,
                    const float* grad_loss, float* grad_score, Stream stream);

// The dense warm-up's KL of a block of rows and its gradient (dense_indexer_kl): score [rows,
// >= keys] (rows score_stride floats apart; -infinity where the row does not see the key) and
// target [rows, >= keys] fp32 (rows target_stride apart). loss [rows] = KL(target ||
// softmax(score)); target's first `keys` columns are overwritten by d loss / d score =
// softmax(score) - target (0 where unseen). Two reads of the scores, one of the target; the same
// bits every run.
void dense_indexer_kl_rows(int64_t rows, int64_t keys, const float* score, int64_t score_stride,
                           float* target_grad, int64_t target_stride, float* loss, Stream stream);

// The dense warm-up's target (kernels/dense_indexer_kl.h) from a block of rows' fp32 attention
// logits [rows, H, keys] (q . key, unscaled): row r sees keys s < visible_keys(first + r) of
// `shape` (its positions, tokens_per_key and num_keys; at most `keys`).
// dense_attention_lse: lse [rows, H] = log sum over them of exp(scale * logit), -infinity for a
// row that sees none. dense_attention_target: target (rows of target_stride >= keys floats)
// [r, s < keys] = (1/H) sum_h exp(scale * logit - lse), 0 where not seen. One read of the logits
// each.
void dense_attention_lse(const IndexerShape& shape, int64_t first, int64_t rows, int64_t heads,
                         int64_t keys, const float* logits, float scale, float* lse, Stream stream);
void dense_attention_target(const IndexerShape& shape, int64_t first, int64_t rows, int64_t heads,
                            int64_t keys, const float* logits, float scale, const float* lse,
                            float* target, int64_t target_stride, Stream stream);

// The same target without logits (dense_target.cu): from q [rows, H, d_qk] (the block's rows) and
// key [M, d_qk] bf16 and lse [rows, H] fp32, tile by tile on tensor cores (sm_90a), written into
// target where row r sees key s < keys (the other entries are left as they were). Shapes:
// dense_attention_target_fused_supported (H in {8, 16, 32, 64, 128}, d_qk a multiple of 64 up
// to 576). The same bits every run.
bool dense_attention_target_fused_supported(int64_t heads, int64_t dim);
void dense_attention_target_fused(const IndexerShape& shape, int64_t first, int64_t rows,
                                  int64_t heads, int64_t dim, int64_t keys, const void* q,
                                  const void* key, float scale, const float* lse, float* target,
                                  int64_t target_stride, Stream stream);
// The lse the target takes, by the same tiles (dense_target.cu, the same shapes): lse [rows, H]
// fp32 of q [rows, H, d_qk] against key [M, d_qk] bf16 over the keys s < keys row r sees,
// -infinity where it sees none. Each block of 128 pairs and 8192 keys keeps running sums, merged
// in a fixed order: the same bits every run. `workspace`: dense_attention_lse_fused_workspace
// floats.
int64_t dense_attention_lse_fused_workspace(int64_t rows, int64_t heads, int64_t keys);
void dense_attention_lse_fused(const IndexerShape& shape, int64_t first, int64_t rows,
                               int64_t heads, int64_t dim, int64_t keys, const void* q,
                               const void* key, float scale, float* workspace, float* lse,
                               Stream stream);

}  // namespace hyscale::cuda
