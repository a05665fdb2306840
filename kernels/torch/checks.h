// Argument checks at the torch-op boundary, shared by every backend: shapes, dtypes and devices
// are validated here with messages naming the op and the argument; kernels trust them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <tuple>

#include "kernels/shapes.h"

namespace hyscale::torch_ops {

// One sequence ([N, ...]) or a batch ([B, N, ...]); kernels run per sequence.
struct Batching {
  int64_t batch = 1;
  bool batched = false;
};

struct IndexerArgs {
  IndexerShape shape;
  Batching batching;
};

struct SparseAttnArgs {
  SparseAttnShape shape;
  Batching batching;
};

// q [B?, N, H_I, d_I], k [B?, M, d_I], w [B?, N, H_I], all floating and on one device.
IndexerArgs check_indexer(const char* op, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& w, int64_t q_offset, int64_t tokens_per_key);

struct DenseIndexerArgs {
  DenseIndexerShape shape;
  Batching batching;
};

// dense_indexer_kl's arguments: the main attention's q [B?, N, H, d_qk] and key [B?, M, d_qk], the
// indexer's q_I, k_I, w as check_indexer takes them, on the same queries and keys, and lse
// [B?, N, H] floating on q's device where given.
DenseIndexerArgs check_dense_indexer_kl(const char* op, const at::Tensor& q, const at::Tensor& key,
                                        const at::Tensor& q_I, const at::Tensor& k_I,
                                        const at::Tensor& w, int64_t q_offset,
                                        int64_t tokens_per_key,
                                        const c10::optional<at::Tensor>& lse);

struct IndexerBackwardArgs {
  IndexerArgs indexer;
  int64_t topk = 0;
};

// index_score_backward's arguments: those of check_indexer, indices as check_indices takes them,
// grad_scores of the shape of indices on the device of q.
IndexerBackwardArgs check_index_score_backward(const char* op, const at::Tensor& grad_scores,
                                               const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& w, const at::Tensor& indices,
                                               int64_t q_offset, int64_t tokens_per_key);

// indexer_loss_backward's arguments: q_I, k_I, w as check_indexer takes them, indices as
// check_indices does, target [B?, N, topk] and score_lse, grad_loss [B?, N] floating on q_I's
// device.
IndexerBackwardArgs check_indexer_loss_backward(const char* op, const at::Tensor& target,
                                                const at::Tensor& score_lse,
                                                const at::Tensor& grad_loss, const at::Tensor& q_I,
                                                const at::Tensor& k_I, const at::Tensor& w,
                                                const at::Tensor& indices);

// indices [B?, N, topk] int32 on the device of q; returns topk.
int64_t check_indices(const char* op, const at::Tensor& indices, const Batching& batching,
                      int64_t num_queries, const at::Tensor& q);

// q [B?, N, H, d_qk], key [B?, M, d_qk], value [B?, M, d_v], indices [B?, N, topk] int32.
// `group` of the sparse attention ops: 0 (the kernels' choice) or a supported G.
void check_query_group(const char* op, int64_t group);

SparseAttnArgs check_sparse_attn(const char* op, const at::Tensor& q, const at::Tensor& key,
                                 const at::Tensor& value, const at::Tensor& indices);

// `t` must have exactly `sizes` (used for gradients and saved outputs).
void check_sizes(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef sizes);

// quantize_e4m3's x: floating, [..., d] with d > 0.
void check_e4m3_input(const char* op, const at::Tensor& x);

// The indexer KL's score and target [..., topk] (every leading dim a row), on one device.
void check_kl_args(const char* op, const at::Tensor& score, const at::Tensor& target);

// Whether `value` is a view of the first d_v columns of contiguous bf16 `key` (absorbed MLA: the
// latent is both key and value), which the CUDA forward reads from the key rows.
bool value_inside_key(const at::Tensor& key, const at::Tensor& value);

// sparse_attn_latent's values: the first dim_v columns of kv (dim_v in [1, d_qk]), as a view.
at::Tensor latent_values(const char* op, const at::Tensor& kv, int64_t dim_v);
// sparse_attn_latent's backward through a separate-values backward, by_parts(key, value) ->
// (grad_q, grad_key, grad_value), run on kv in fp32 at least: kv's gradient, grad_key with
// grad_value added into its first dim_v columns, is rounded to kv's dtype once, after the sum.
using SeparateValuesBackward = std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor& key, const at::Tensor& value)>;
std::tuple<at::Tensor, at::Tensor> latent_backward_by_parts(const char* op, const at::Tensor& kv,
                                                            int64_t dim_v,
                                                            const SeparateValuesBackward& by_parts);

// CPU kernels compute in double for double inputs (gradient checks) and in float otherwise.
at::ScalarType cpu_compute_dtype(const at::Tensor& t);

}  // namespace hyscale::torch_ops
