// The C++ API of HyScale's torch ops, as the trainer calls them. Each call goes through the
// dispatcher, so autograd (autograd.cc) and the device backend (cpu.cc, cuda/) apply.
// Shapes: one sequence ([N, ...]) or a batch ([B, N, ...]); see library.cc for the schemas.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyscale::ops {

struct Selection {
  at::Tensor indices;  // [.., N, topk] int32 in ascending key order, -1 in unused slots
  at::Tensor scores;   // [.., N, topk] differentiable w.r.t. q, k, w; -inf in unused slots
};

// Exact top-k of the lightning-indexer scores, without an N x M score table. With `fp8`, q and k
// are first quantized to e4m3 rows (quantize_e4m3) and the selection is the exact top-k of the
// fp8 scores (kernels/fp8.h); the returned scores are those fp8 scores, and their gradient is the
// bf16 scores' (straight-through).
Selection flash_topk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, int64_t topk,
                     int64_t q_offset = 0, int64_t tokens_per_key = 1, bool fp8 = false);

struct Fp8Rows {
  at::Tensor values;  // [..., d] uint8 e4m3 bits
  at::Tensor scales;  // [...] fp32
};
// Rows (the last dim) of x quantized to fp8 e4m3 with one scale a row (kernels/fp8.h).
Fp8Rows quantize_e4m3(const at::Tensor& x);

// Index scores recomputed only at `indices` (selection replay); differentiable w.r.t. q, k, w.
at::Tensor index_score_gather(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                              const at::Tensor& indices, int64_t q_offset = 0,
                              int64_t tokens_per_key = 1);

struct Attention {
  at::Tensor out;  // [.., N, H, d_v], differentiable w.r.t. q, key, value
  at::Tensor lse;  // [.., N, H], not differentiable
};

// `group`: the CUDA kernels' query-group size G (1, 2, 4, 8 or 16); 0 leaves it to them. The CPU
// reference checks it and computes the same function at any G.
Attention sparse_attn(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                      const at::Tensor& indices, double scale, int64_t group = 0);

// Absorbed MLA: kv [.., M, d_qk] is the keys and its first dim_v columns the values
// (DeepSeek-V3.2's latent); differentiable w.r.t. q and kv, whose gradient holds both roles'. Equal
// to sparse_attn(q, kv, kv.narrow(-1, 0, dim_v), ...), with one gather of each row and, on the GPU,
// a backward that forms kv's gradient in one pass.
Attention sparse_attn_latent(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
                             double scale, int64_t dim_v, int64_t group = 0);

// Attention probabilities at `indices`, summed over heads and L1-normalised per row; the
// indexer's sparse-stage target (not differentiable).
at::Tensor selected_attention_mass(const at::Tensor& q, const at::Tensor& key,
                                   const at::Tensor& indices, const at::Tensor& lse, double scale);

// Per-row KL(target || softmax(score)) over the valid slots; differentiable w.r.t. score only.
at::Tensor indexer_kl(const at::Tensor& score, const at::Tensor& target);

// The dense warm-up stage's indexer loss, KL(target || softmax(I)) per query row over every
// visible key, without an [N, M] table: the target is the frozen attention's (q [.., N, H, d_qk],
// key [.., M, d_qk], `scale`) probabilities summed over heads and divided by H; I is the indexer's
// score of (q_I, k_I, w) as flash_topk takes them. `lse` [.., N, H]: the attention's log-sum-exps
// over each row's visible keys (scale included) where a forward made them; undefined: computed.
// Returns loss [.., N] and the gradients of sum(loss) w.r.t. q_I, k_I, w (the caller scales
// them); not differentiable itself.
struct DenseIndexerLoss {
  at::Tensor loss, grad_q, grad_k, grad_w;
};
DenseIndexerLoss dense_indexer_kl(const at::Tensor& q, const at::Tensor& key, const at::Tensor& q_I,
                                  const at::Tensor& k_I, const at::Tensor& w, double scale,
                                  int64_t q_offset = 0, int64_t tokens_per_key = 1,
                                  const at::Tensor& lse = {});
// The rows a dense_indexer_kl call on q_I's device is best a whole multiple of (whole waves of its
// GPU kernels; 1 on the CPU): a caller that picks its query chunks rounds them to it.
int64_t dense_indexer_kl_row_multiple(const at::Tensor& q_I);

// The backward ops autograd calls (autograd.cc); callable directly, e.g. by benchmarks.
struct IndexScoreGrads {
  at::Tensor q, k, w;
};
IndexScoreGrads index_score_backward(const at::Tensor& grad_scores, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& w,
                                     const at::Tensor& indices, int64_t q_offset = 0,
                                     int64_t tokens_per_key = 1);

struct AttentionGrads {
  at::Tensor q, key, value;
};
AttentionGrads sparse_attn_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                    const at::Tensor& key, const at::Tensor& value,
                                    const at::Tensor& indices, double scale, const at::Tensor& out,
                                    const at::Tensor& lse, int64_t group = 0);

struct LatentAttentionGrads {
  at::Tensor q, kv;
};
LatentAttentionGrads sparse_attn_latent_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                 const at::Tensor& kv, const at::Tensor& indices,
                                                 double scale, int64_t dim_v, const at::Tensor& out,
                                                 const at::Tensor& lse, int64_t group = 0);

// sparse_attn_latent_backward's gradients and the indexer's target, selected_attention_mass(q, kv,
// indices, lse, scale), which the CUDA latent kernel forms from the probabilities it recomputes
// anyway (elsewhere the two ops run one after the other).
struct LatentAttentionGradsAndTarget {
  at::Tensor q, kv, target;
};
LatentAttentionGradsAndTarget sparse_attn_latent_backward_target(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t group = 0);

at::Tensor indexer_kl_backward(const at::Tensor& grad_loss, const at::Tensor& score,
                               const at::Tensor& target);

// The indexer's KL on its selection with the backward of its scores (library.cc): per row the
// loss, and the gradients of sum(grad_loss * loss) w.r.t. q, k and w.
struct IndexerLossGrads {
  at::Tensor loss, q, k, w;
};
IndexerLossGrads indexer_loss_backward(const at::Tensor& target, const at::Tensor& score_lse,
                                       const at::Tensor& grad_loss, const at::Tensor& q,
                                       const at::Tensor& k, const at::Tensor& w,
                                       const at::Tensor& indices);

// The indexer's KL loss on its selection, for a forward whose backward follows at once (a
// recomputation's, or a step's without it): the loss's target is a by-product of the attention
// backward (sparse_attn_latent_backward_target), so the forward cannot know the loss. Two
// autograd nodes (library.cc), whose backwards a phase clock can time apart: indexer_loss takes
// the indexer's projections at the selection, q_I [.., N, H_I, d_I], k_I [.., M, d_I] and
// w [.., N, H_I] (differentiable), and each row's score_lse (the log-sum-exp of its index scores
// over its valid slots, the selection's; not differentiated), and returns two slots for
// sparse_attn_indexer_loss, which returns the attention's out and lse and `loss`: zeros [.., N],
// the handle through which the loss's gradient (per row) reaches the backward. The attention's
// backward forms the target; indexer_loss's then writes each row's KL(target || softmax(scores))
// into `loss_rows` (a plain [.., N] buffer the caller reads after it) and gives q_I, k_I and w
// their gradients (indexer_loss_backward: the scores are formed there, so none is kept from the
// forward).
struct IndexerLossSlots {
  at::Tensor target, loss;
};
IndexerLossSlots indexer_loss(const at::Tensor& q_I, const at::Tensor& k_I, const at::Tensor& w,
                              const at::Tensor& indices, const at::Tensor& score_lse,
                              const at::Tensor& loss_rows);
// `value` undefined means the latent (sparse_attn_latent with `dim_v`).
struct AttentionAndIndexerLoss {
  at::Tensor out, lse, loss;
};
AttentionAndIndexerLoss sparse_attn_indexer_loss(const at::Tensor& q, const at::Tensor& key,
                                                 const at::Tensor& value, const at::Tensor& indices,
                                                 const IndexerLossSlots& slots, double scale,
                                                 int64_t dim_v, int64_t group = 0);

}  // namespace hyscale::ops
