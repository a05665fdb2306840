#include "kernels/torch/checks.h"

#include <c10/util/Exception.h>

#include "kernels/cuda_shapes.h"

namespace hyscale::torch_ops {
namespace {

// Leading batch dimension present when the tensor has one more dim than its per-sequence rank.
Batching batching_of(const char* op, const char* name, const at::Tensor& t, int64_t rank) {
  TORCH_CHECK(t.dim() == rank || t.dim() == rank + 1, op, ": ", name, " must have ", rank,
              " dims (one sequence) or ", rank + 1, " (a batch), got shape ", t.sizes());
  Batching b;
  b.batched = t.dim() == rank + 1;
  b.batch = b.batched ? t.size(0) : 1;
  return b;
}

int64_t seq_dim(const at::Tensor& t, const Batching& b, int64_t d) {
  return t.size(d + (b.batched ? 1 : 0));
}

void check_same_batching(const char* op, const char* name, const at::Tensor& t, int64_t rank,
                         const Batching& expected) {
  const Batching b = batching_of(op, name, t, rank);
  TORCH_CHECK(b.batched == expected.batched && b.batch == expected.batch, op, ": ", name,
              " must have the same batch layout as the first argument, got shape ", t.sizes());
}

void check_floating(const char* op, const char* name, const at::Tensor& t, const at::Tensor& ref) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name,
              " must be a floating tensor, got ", t.scalar_type());
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(),
              " but the first argument is on ", ref.device());
}

// The attention's q [B?, N, H, d_qk] and key [B?, M, d_qk], floating and on one device: returns
// q's batch layout, which key must share, and sets shape->heads and shape->dim_qk.
template <typename Shape>
Batching check_attention_qk(const char* op, const at::Tensor& q, const at::Tensor& key,
                            Shape* shape) {
  const Batching batching = batching_of(op, "q", q, 3);
  check_same_batching(op, "key", key, 2, batching);
  check_floating(op, "q", q, q);
  check_floating(op, "key", key, q);
  shape->heads = seq_dim(q, batching, 1);
  shape->dim_qk = seq_dim(q, batching, 2);
  TORCH_CHECK(seq_dim(key, batching, 1) == shape->dim_qk, op,
              ": key must be [M, d_qk] with d_qk = ", shape->dim_qk, " (from q), got shape ",
              key.sizes());
  return batching;
}

// The indexer's tensors under the names an op gives them; q's layout is the batch layout.
struct IndexerNames {
  const char* q;
  const char* k;
  const char* w;
};

IndexerArgs indexer_args(const char* op, const IndexerNames& names, const at::Tensor& q,
                         const at::Tensor& k, const at::Tensor& w, int64_t q_offset,
                         int64_t tokens_per_key) {
  IndexerArgs a;
  a.batching = batching_of(op, names.q, q, 3);
  check_same_batching(op, names.k, k, 2, a.batching);
  check_same_batching(op, names.w, w, 2, a.batching);
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{names.q, q}, {names.k, k}, {names.w, w}}) {
    check_floating(op, name, t, q);
  }
  a.shape.num_queries = seq_dim(q, a.batching, 0);
  a.shape.heads = seq_dim(q, a.batching, 1);
  a.shape.dim = seq_dim(q, a.batching, 2);
  a.shape.num_keys = seq_dim(k, a.batching, 0);
  a.shape.q_offset = q_offset;
  a.shape.visibility.tokens_per_key = tokens_per_key;
  TORCH_CHECK(seq_dim(k, a.batching, 1) == a.shape.dim, op, ": ", names.k,
              " must be [M, d_I] with d_I = ", a.shape.dim, " (from ", names.q, "), got shape ",
              k.sizes());
  TORCH_CHECK(seq_dim(w, a.batching, 0) == a.shape.num_queries &&
                  seq_dim(w, a.batching, 1) == a.shape.heads,
              op, ": ", names.w, " must be [N, H_I] = [", a.shape.num_queries, ", ", a.shape.heads,
              "] (from ", names.q, "), got shape ", w.sizes());
  TORCH_CHECK(q_offset >= 0, op, ": q_offset must be >= 0, got ", q_offset);
  TORCH_CHECK(tokens_per_key >= 1, op, ": tokens_per_key must be >= 1, got ", tokens_per_key);
  return a;
}

}  // namespace

IndexerArgs check_indexer(const char* op, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& w, int64_t q_offset, int64_t tokens_per_key) {
  return indexer_args(op, {"q", "k", "w"}, q, k, w, q_offset, tokens_per_key);
}

DenseIndexerArgs check_dense_indexer_kl(const char* op, const at::Tensor& q, const at::Tensor& key,
                                        const at::Tensor& q_I, const at::Tensor& k_I,
                                        const at::Tensor& w, int64_t q_offset,
                                        int64_t tokens_per_key,
                                        const c10::optional<at::Tensor>& lse) {
  DenseIndexerArgs a;
  a.batching = check_attention_qk(op, q, key, &a.shape);
  check_same_batching(op, "q_I", q_I, 3, a.batching);
  check_floating(op, "q_I", q_I, q);
  a.shape.indexer =
      indexer_args(op, {"q_I", "k_I", "w"}, q_I, k_I, w, q_offset, tokens_per_key).shape;
  TORCH_CHECK(seq_dim(q, a.batching, 0) == a.shape.indexer.num_queries, op,
              ": q_I must have one row per query of q (", seq_dim(q, a.batching, 0),
              "), got shape ", q_I.sizes());
  TORCH_CHECK(seq_dim(key, a.batching, 0) == a.shape.indexer.num_keys, op,
              ": k_I must have one row per key of key (", seq_dim(key, a.batching, 0),
              "), got shape ", k_I.sizes());
  if (lse) {
    check_same_batching(op, "lse", *lse, 2, a.batching);
    check_floating(op, "lse", *lse, q);
    TORCH_CHECK(seq_dim(*lse, a.batching, 0) == a.shape.indexer.num_queries &&
                    seq_dim(*lse, a.batching, 1) == a.shape.heads,
                op, ": lse must be [N, H] = [", a.shape.indexer.num_queries, ", ", a.shape.heads,
                "] (from q), got shape ", lse->sizes());
  }
  return a;
}

int64_t check_indices(const char* op, const at::Tensor& indices, const Batching& batching,
                      int64_t num_queries, const at::Tensor& q) {
  check_same_batching(op, "indices", indices, 2, batching);
  TORCH_CHECK(indices.scalar_type() == at::kInt, op, ": indices must be int32, got ",
              indices.scalar_type());
  TORCH_CHECK(indices.device() == q.device(), op, ": indices is on ", indices.device(),
              " but q is on ", q.device());
  TORCH_CHECK(seq_dim(indices, batching, 0) == num_queries, op,
              ": indices must have one row per query (", num_queries, "), got shape ",
              indices.sizes());
  const int64_t topk = seq_dim(indices, batching, 1);
  TORCH_CHECK(topk > 0, op, ": indices must have at least one column, got shape ", indices.sizes());
  return topk;
}

IndexerBackwardArgs check_index_score_backward(const char* op, const at::Tensor& grad_scores,
                                               const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& w, const at::Tensor& indices,
                                               int64_t q_offset, int64_t tokens_per_key) {
  IndexerBackwardArgs a;
  a.indexer = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  a.topk = check_indices(op, indices, a.indexer.batching, a.indexer.shape.num_queries, q);
  check_sizes(op, "grad_scores", grad_scores, indices.sizes());
  TORCH_CHECK(grad_scores.device() == q.device(), op, ": grad_scores is on ", grad_scores.device(),
              " but q is on ", q.device());
  return a;
}

IndexerBackwardArgs check_indexer_loss_backward(const char* op, const at::Tensor& target,
                                                const at::Tensor& score_lse,
                                                const at::Tensor& grad_loss, const at::Tensor& q_I,
                                                const at::Tensor& k_I, const at::Tensor& w,
                                                const at::Tensor& indices) {
  IndexerBackwardArgs a;
  // Visibility is the selection's contract here (the op sees no positions): indices are checked
  // against the keys' range only, as the attention ops check them.
  a.indexer = indexer_args(op, {"q_I", "k_I", "w"}, q_I, k_I, w, 0, 1);
  a.topk = check_indices(op, indices, a.indexer.batching, a.indexer.shape.num_queries, q_I);
  check_sizes(op, "target", target, indices.sizes());
  const auto rows = indices.sizes().slice(0, indices.dim() - 1);
  check_sizes(op, "score_lse", score_lse, rows);
  check_sizes(op, "grad_loss", grad_loss, rows);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"target", target},
                                {"score_lse", score_lse},
                                {"grad_loss", grad_loss}}) {
    check_floating(op, name, t, q_I);
  }
  return a;
}

void check_query_group(const char* op, int64_t group) {
  TORCH_CHECK(group == 0 || cuda_query_group_supported(group), op,
              ": group must be 0 (the kernels' choice) or ", kCudaQueryGroups, ", got ", group);
}

SparseAttnArgs check_sparse_attn(const char* op, const at::Tensor& q, const at::Tensor& key,
                                 const at::Tensor& value, const at::Tensor& indices) {
  SparseAttnArgs a;
  a.batching = check_attention_qk(op, q, key, &a.shape);
  check_same_batching(op, "value", value, 2, a.batching);
  check_floating(op, "value", value, q);
  a.shape.num_queries = seq_dim(q, a.batching, 0);
  a.shape.num_keys = seq_dim(key, a.batching, 0);
  a.shape.dim_v = seq_dim(value, a.batching, 1);
  TORCH_CHECK(seq_dim(value, a.batching, 0) == a.shape.num_keys, op,
              ": value must have as many rows as key (", a.shape.num_keys, "), got shape ",
              value.sizes());
  a.shape.topk = check_indices(op, indices, a.batching, a.shape.num_queries, q);
  return a;
}

void check_sizes(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef sizes) {
  TORCH_CHECK(t.sizes() == sizes, op, ": ", name, " must have shape ", sizes, ", got ", t.sizes());
}

void check_e4m3_input(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, op,
              ": x must be [..., d] with d > 0 (rows along the last dim), got shape ", x.sizes());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be floating, got ",
              x.scalar_type());
}

void check_kl_args(const char* op, const at::Tensor& score, const at::Tensor& target) {
  TORCH_CHECK(score.dim() >= 1 && score.size(-1) > 0, op,
              ": score must be [..., topk] with topk > 0, got shape ", score.sizes());
  TORCH_CHECK(at::isFloatingType(score.scalar_type()), op, ": score must be floating, got ",
              score.scalar_type());
  check_sizes(op, "target", target, score.sizes());
  TORCH_CHECK(target.device() == score.device(), op, ": target is on ", target.device(),
              " but score is on ", score.device());
}

bool value_inside_key(const at::Tensor& key, const at::Tensor& value) {
  if (key.scalar_type() != at::kBFloat16 || value.scalar_type() != at::kBFloat16 ||
      !key.is_contiguous() || value.data_ptr() != key.data_ptr() || value.dim() != key.dim() ||
      value.stride(-1) != 1) {
    return false;
  }
  for (int64_t d = 0; d + 1 < key.dim(); ++d) {
    if (value.size(d) != key.size(d) || value.stride(d) != key.stride(d)) return false;
  }
  return true;
}

at::Tensor latent_values(const char* op, const at::Tensor& kv, int64_t dim_v) {
  TORCH_CHECK(kv.dim() >= 2, op, ": kv must be [M, d_qk] or [B, M, d_qk], got ", kv.sizes());
  TORCH_CHECK(dim_v >= 1 && dim_v <= kv.size(-1), op, ": dim_v must be in [1, d_qk = ", kv.size(-1),
              "], got ", dim_v);
  return kv.narrow(-1, 0, dim_v);
}

std::tuple<at::Tensor, at::Tensor> latent_backward_by_parts(
    const char* op, const at::Tensor& kv, int64_t dim_v, const SeparateValuesBackward& by_parts) {
  const auto rows = kv.to(c10::promoteTypes(kv.scalar_type(), at::kFloat));
  auto [grad_q, grad_key, grad_value] = by_parts(rows, latent_values(op, rows, dim_v));
  grad_key.narrow(-1, 0, dim_v).add_(grad_value);
  return {grad_q, grad_key.to(kv.scalar_type())};
}

at::ScalarType cpu_compute_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace hyscale::torch_ops
