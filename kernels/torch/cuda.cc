// CUDA implementations of the hyscale ops (built when HyScale is configured with CUDA): argument
// checks shared with the CPU backend, dtype conversion to what the kernels take (bf16 q/k, fp32
// w), and the per-sequence calls into kernels/cuda.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "kernels/cuda/flash_topk_cuda.h"
#include "kernels/cuda/indexer_loss_cuda.h"
#include "kernels/cuda/sparse_attn_cuda.h"
#include "kernels/torch/checks.h"

namespace hyscale::torch_ops {
namespace {

// Per-sequence inputs in the kernels' dtypes, with a leading batch dim.
struct IndexerInputs {
  at::Tensor q, k, w;
};

// t with a leading batch dim (unbatch's inverse), in `dtype` and contiguous for the kernels.
at::Tensor batched(const at::Tensor& t, const Batching& b, at::ScalarType dtype) {
  return (b.batched ? t : t.unsqueeze(0)).to(dtype).contiguous();
}

IndexerInputs indexer_inputs(const char* op, const IndexerArgs& a, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& w) {
  TORCH_CHECK(cuda_indexer_shape_supported(a.shape.heads, a.shape.dim), op,
              ": the CUDA kernels take ", kCudaIndexerShapes, ", got H_I = ", a.shape.heads,
              ", d_I = ", a.shape.dim);
  const Batching& b = a.batching;
  return {batched(q, b, at::kBFloat16), batched(k, b, at::kBFloat16), batched(w, b, at::kFloat)};
}

at::Tensor unbatch(const at::Tensor& t, const Batching& b) {
  return b.batched ? t : t.squeeze(0);
}

cuda::Stream current_stream() {
  return at::cuda::getCurrentCUDAStream().stream();
}

// Rows of x (bf16 or fp32 read as they are; other dtypes as fp32) as e4m3 bits and scales.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const auto in = (bf16 ? x : x.to(at::kFloat)).contiguous();
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  auto values = at::empty(x.sizes(), x.options().dtype(at::kByte));
  auto scales = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  cuda::quantize_rows_e4m3(in.data_ptr(), bf16, rows, dim, values.data_ptr<uint8_t>(),
                           scales.data_ptr<float>(), current_stream());
  return {values, scales};
}

std::tuple<at::Tensor, at::Tensor> quantize_e4m3(const at::Tensor& x) {
  check_e4m3_input("hyscale::quantize_e4m3", x);
  const c10::cuda::CUDAGuard guard(x.device());
  return quantize_rows(x);
}

std::tuple<at::Tensor, at::Tensor> flash_topk(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& w, int64_t topk, int64_t q_offset,
                                              int64_t tokens_per_key, bool fp8) {
  const char* op = "hyscale::flash_topk";
  const IndexerArgs a = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  TORCH_CHECK(topk >= 1 && topk <= cuda::kMaxTopk, op, ": topk must be in [1, ", cuda::kMaxTopk,
              "] on CUDA, got ", topk);
  const c10::cuda::CUDAGuard guard(q.device());
  IndexerInputs in = indexer_inputs(op, a, q, k, w);
  at::Tensor key_scales;
  if (fp8) {
    // The scales leave the tensor-core products: the queries' go into the weights, the keys'
    // multiply each score after the head sum (kernels/fp8.h).
    at::Tensor q_scales;
    std::tie(in.q, q_scales) = quantize_rows(in.q);
    std::tie(in.k, key_scales) = quantize_rows(in.k);
    in.w = in.w * q_scales;
  }
  const int64_t n = a.shape.num_queries;
  auto indices = at::empty({a.batching.batch, n, topk}, q.options().dtype(at::kInt));
  auto scores = at::empty({a.batching.batch, n, topk}, q.options().dtype(at::kFloat));
  auto workspace =
      at::empty({static_cast<int64_t>(cuda::flash_topk_workspace_bytes(a.shape, topk))},
                q.options().dtype(at::kByte));
  for (int64_t b = 0; b < a.batching.batch; ++b) {
    const cuda::IndexerOperands operands{in.q[b].data_ptr(), in.k[b].data_ptr(),
                                         in.w[b].data_ptr<float>(),
                                         fp8 ? key_scales[b].data_ptr<float>() : nullptr};
    cuda::flash_topk(a.shape, operands, topk, indices[b].data_ptr<int32_t>(),
                     scores[b].data_ptr<float>(), workspace.data_ptr(), current_stream());
  }
  return {unbatch(indices, a.batching), unbatch(scores, a.batching)};
}

at::Tensor index_score_gather(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                              const at::Tensor& indices, int64_t q_offset, int64_t tokens_per_key) {
  const char* op = "hyscale::index_score_gather";
  const IndexerArgs a = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  const int64_t topk = check_indices(op, indices, a.batching, a.shape.num_queries, q);
  const c10::cuda::CUDAGuard guard(q.device());
  const IndexerInputs in = indexer_inputs(op, a, q, k, w);
  const auto idx = batched(indices, a.batching, indices.scalar_type());
  if (idx.numel() > 0) {
    const auto [lowest, highest] = at::aminmax(idx);
    TORCH_CHECK(lowest.item<int>() >= -1 && highest.item<int>() < a.shape.num_keys, op,
                ": indices must be -1 or in [0, ", a.shape.num_keys, ")");
  }
  auto scores = at::empty(idx.sizes(), q.options().dtype(at::kFloat));
  for (int64_t b = 0; b < a.batching.batch; ++b) {
    cuda::index_score_gather(a.shape, in.q[b].data_ptr(), in.k[b].data_ptr(),
                             in.w[b].data_ptr<float>(), idx[b].data_ptr<int32_t>(), topk,
                             scores[b].data_ptr<float>(), current_stream());
  }
  return unbatch(scores, a.batching);
}

at::Tensor index_score_table(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                             int64_t row_begin, int64_t rows, int64_t q_offset,
                             int64_t tokens_per_key) {
  const char* op = "hyscale::index_score_table";
  const IndexerArgs a = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  TORCH_CHECK(!a.batching.batched, op, ": takes one sequence, got a batch");
  TORCH_CHECK(row_begin >= 0 && rows >= 0 && row_begin + rows <= a.shape.num_queries, op,
              ": rows [", row_begin, ", ", row_begin + rows, ") must lie in [0, ",
              a.shape.num_queries, ")");
  const c10::cuda::CUDAGuard guard(q.device());
  const IndexerInputs in = indexer_inputs(op, a, q, k, w);
  auto table = at::empty({rows, a.shape.num_keys}, q.options().dtype(at::kFloat));
  cuda::index_score_table(a.shape, in.q.data_ptr(), in.k.data_ptr(), in.w.data_ptr<float>(),
                          row_begin, rows, table.data_ptr<float>(), nullptr, a.shape.num_keys,
                          current_stream());
  return table;
}

// sparse_attn: bf16 inputs for the kernels, per-sequence calls; out in q's dtype, lse fp32.
struct AttnInputs {
  SparseAttnArgs a;
  at::Tensor q, key, value, indices;  // with a leading batch dim, contiguous, bf16 / int32
};

// reads_values_from_keys: the caller's kernel takes value == key for a value inside the key rows
// (the forward), which then skips its copy and its separate gather.
AttnInputs attn_inputs(const char* op, const at::Tensor& q, const at::Tensor& key,
                       const at::Tensor& value, const at::Tensor& indices, int64_t group,
                       bool reads_values_from_keys) {
  AttnInputs in;
  in.a = check_sparse_attn(op, q, key, value, indices);
  const auto& s = in.a.shape;
  TORCH_CHECK(cuda_sparse_attn_dims_supported(s.dim_qk, s.dim_v), op, ": the CUDA kernels take ",
              kCudaSparseAttnDims, ", got (", s.dim_qk, ", ", s.dim_v, ")");
  TORCH_CHECK(cuda::sparse_attn_group_supported(group, s.topk), op,
              ": group must be 1, 2, 4, 8 or 16 with group * topk <= 32768, got group = ", group,
              ", topk = ", s.topk);
  const Batching& b = in.a.batching;
  in.q = batched(q, b, at::kBFloat16);
  in.key = batched(key, b, at::kBFloat16);
  in.value = reads_values_from_keys && value_inside_key(key, value) &&
                     cuda::sparse_attn_fwd_reads_values_from_keys(s, group)
                 ? in.key
                 : batched(value, b, at::kBFloat16);
  in.indices = batched(indices, b, indices.scalar_type());
  if (in.indices.numel() > 0) {
    const auto [lowest, highest] = at::aminmax(in.indices);
    TORCH_CHECK(lowest.item<int>() >= -1 && highest.item<int>() < s.num_keys, op,
                ": indices must be -1 or in [0, ", s.num_keys, ")");
  }
  return in;
}

std::tuple<at::Tensor, at::Tensor> sparse_attn_grouped(const at::Tensor& q, const at::Tensor& key,
                                                       const at::Tensor& value,
                                                       const at::Tensor& indices, double scale,
                                                       int64_t group) {
  const char* op = "hyscale::sparse_attn";
  const c10::cuda::CUDAGuard guard(q.device());
  const AttnInputs in =
      attn_inputs(op, q, key, value, indices, group, /*reads_values_from_keys=*/true);
  const auto& s = in.a.shape;
  const int64_t batch = in.a.batching.batch;
  auto out = at::empty({batch, s.num_queries, s.heads, s.dim_v}, in.q.options());
  auto lse = at::empty({batch, s.num_queries, s.heads}, in.q.options().dtype(at::kFloat));
  auto workspace =
      at::empty({static_cast<int64_t>(cuda::sparse_attn_fwd_workspace_bytes(s, group))},
                q.options().dtype(at::kByte));
  for (int64_t b = 0; b < batch; ++b) {
    cuda::sparse_attn_fwd(s, in.q[b].data_ptr(), in.key[b].data_ptr(), in.value[b].data_ptr(),
                          in.indices[b].data_ptr<int32_t>(), static_cast<float>(scale), group,
                          out[b].data_ptr(), lse[b].data_ptr<float>(), workspace.data_ptr(),
                          current_stream());
  }
  return {unbatch(out, in.a.batching).to(q.scalar_type()), unbatch(lse, in.a.batching)};
}

// The backward's other inputs: grad_out and out bf16, lse fp32, each with a leading batch dim.
struct ForwardResults {
  at::Tensor grad_out, out, lse;
};

ForwardResults forward_results(const char* op, const AttnInputs& in, const at::Tensor& grad_out,
                               const at::Tensor& out, const at::Tensor& lse) {
  const auto& s = in.a.shape;
  const int64_t batch = in.a.batching.batch;
  check_sizes(op, "grad_out", grad_out, out.sizes());
  const Batching& b = in.a.batching;
  ForwardResults r{batched(grad_out, b, at::kBFloat16), batched(out, b, at::kBFloat16),
                   batched(lse, b, at::kFloat)};
  check_sizes(op, "out", r.out, {batch, s.num_queries, s.heads, s.dim_v});
  check_sizes(op, "lse", r.lse, {batch, s.num_queries, s.heads});
  return r;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attn_backward_grouped(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& indices, double scale, const at::Tensor& out, const at::Tensor& lse,
    int64_t group, bool deterministic) {
  const char* op = "hyscale::sparse_attn_backward";
  const c10::cuda::CUDAGuard guard(q.device());
  const AttnInputs in =
      attn_inputs(op, q, key, value, indices, group, /*reads_values_from_keys=*/false);
  const auto& s = in.a.shape;
  const int64_t batch = in.a.batching.batch;
  const auto [go, o, l] = forward_results(op, in, grad_out, out, lse);
  auto grad_q = at::empty_like(in.q);
  auto grad_key = at::empty(in.key.sizes(), in.key.options().dtype(at::kFloat));
  auto grad_value = at::empty(in.value.sizes(), in.value.options().dtype(at::kFloat));
  auto workspace = at::empty(
      {static_cast<int64_t>(cuda::sparse_attn_bwd_workspace_bytes(s, group, deterministic))},
      q.options().dtype(at::kByte));
  for (int64_t b = 0; b < batch; ++b) {
    cuda::sparse_attn_bwd(s, in.q[b].data_ptr(), in.key[b].data_ptr(), in.value[b].data_ptr(),
                          in.indices[b].data_ptr<int32_t>(), static_cast<float>(scale),
                          o[b].data_ptr(), l[b].data_ptr<float>(), go[b].data_ptr(), group,
                          deterministic, grad_q[b].data_ptr(), grad_key[b].data_ptr<float>(),
                          grad_value[b].data_ptr<float>(), workspace.data_ptr(), current_stream());
  }
  return {unbatch(grad_q, in.a.batching).to(q.scalar_type()),
          unbatch(grad_key, in.a.batching).to(key.scalar_type()),
          unbatch(grad_value, in.a.batching).to(value.scalar_type())};
}

// The op's `group`, or where it is 0 the G sparse_attn_default_group picks.
int64_t group_or_default(int64_t group, const at::Tensor& q, const at::Tensor& indices) {
  return group != 0 ? group : cuda::sparse_attn_default_group(q.size(-2), indices.size(-1));
}

// The schema's ops; the backward is deterministic when torch.use_deterministic_algorithms(True)
// is in effect, else it uses fp32 atomics.
std::tuple<at::Tensor, at::Tensor> sparse_attn(const at::Tensor& q, const at::Tensor& key,
                                               const at::Tensor& value, const at::Tensor& indices,
                                               double scale, int64_t group) {
  return sparse_attn_grouped(q, key, value, indices, scale, group_or_default(group, q, indices));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attn_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& indices, double scale, const at::Tensor& out, const at::Tensor& lse,
    int64_t group) {
  return sparse_attn_backward_grouped(grad_out, q, key, value, indices, scale, out, lse,
                                      group_or_default(group, q, indices),
                                      at::globalContext().deterministicAlgorithms());
}

// Absorbed MLA (kv both keys and values): the forward takes the warp-specialized kernel through
// value == key; the backward its one kernel where it applies, else the separate values' backward
// with the value gradient added into kv's.
std::tuple<at::Tensor, at::Tensor> sparse_attn_latent(const at::Tensor& q, const at::Tensor& kv,
                                                      const at::Tensor& indices, double scale,
                                                      int64_t dim_v, int64_t group) {
  // bf16 first, so that the values stay a view of the rows the kernel gathers.
  const auto rows = kv.to(at::kBFloat16).contiguous();
  return sparse_attn(q, rows, latent_values("hyscale::sparse_attn_latent", rows, dim_v), indices,
                     scale, group);
}

at::Tensor selected_attention_mass(const at::Tensor& q, const at::Tensor& key,
                                   const at::Tensor& indices, const at::Tensor& lse, double scale);

// Each row of mass [.., topk] divided by its sum (rows summing to 0 left as they are).
at::Tensor l1_normalised(const at::Tensor& mass) {
  const auto total = mass.sum(-1, /*keepdim=*/true);
  return at::where(total.gt(0), mass / total, mass);
}

// The latent backward and, with_target, the indexer's target: from the latent kernel's mass where
// it runs, else from selected_attention_mass after the backward by parts.
std::tuple<at::Tensor, at::Tensor, at::Tensor> latent_backward(
    const char* op, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t requested_group, bool with_target) {
  const auto value = latent_values(op, kv, dim_v);
  const int64_t group = group_or_default(requested_group, q, indices);
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  if (!cuda::sparse_attn_bwd_latent_supported(check_sparse_attn(op, q, kv, value, indices).shape,
                                              group, deterministic)) {
    auto [grad_q, grad_kv] = latent_backward_by_parts(
        op, kv, dim_v, [&](const at::Tensor& key, const at::Tensor& value_of_key) {
          return sparse_attn_backward_grouped(grad_out, q, key, value_of_key, indices, scale, out,
                                              lse, group, deterministic);
        });
    return {grad_q, grad_kv,
            with_target ? selected_attention_mass(q, kv, indices, lse, scale) : at::Tensor()};
  }
  const c10::cuda::CUDAGuard guard(q.device());
  const AttnInputs in = attn_inputs(op, q, kv, value, indices, group,
                                    /*reads_values_from_keys=*/true);
  const auto& s = in.a.shape;
  const auto [go, o, l] = forward_results(op, in, grad_out, out, lse);
  auto grad_q = at::empty_like(in.q);
  auto grad_kv = at::empty(in.key.sizes(), in.key.options().dtype(at::kFloat));
  auto mass = with_target ? at::empty(in.indices.sizes(), grad_kv.options()) : at::Tensor();
  auto workspace =
      at::empty({static_cast<int64_t>(cuda::sparse_attn_bwd_latent_workspace_bytes(s))},
                q.options().dtype(at::kByte));
  for (int64_t b = 0; b < in.a.batching.batch; ++b) {
    cuda::sparse_attn_bwd_latent(
        s, in.q[b].data_ptr(), in.key[b].data_ptr(), in.indices[b].data_ptr<int32_t>(),
        static_cast<float>(scale), o[b].data_ptr(), l[b].data_ptr<float>(), go[b].data_ptr(),
        grad_q[b].data_ptr(), grad_kv[b].data_ptr<float>(),
        with_target ? mass[b].data_ptr<float>() : nullptr, workspace.data_ptr(), current_stream());
  }
  return {unbatch(grad_q, in.a.batching).to(q.scalar_type()),
          unbatch(grad_kv, in.a.batching).to(kv.scalar_type()),
          with_target ? unbatch(l1_normalised(mass), in.a.batching) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor> sparse_attn_latent_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t group) {
  auto [grad_q, grad_kv, target] = latent_backward("hyscale::sparse_attn_latent_backward", grad_out,
                                                   q, kv, indices, scale, dim_v, out, lse, group,
                                                   /*with_target=*/false);
  return {grad_q, grad_kv};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attn_latent_backward_target(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t group) {
  return latent_backward("hyscale::sparse_attn_latent_backward_target", grad_out, q, kv, indices,
                         scale, dim_v, out, lse, group, /*with_target=*/true);
}

// ---- The indexer's training path: score backward, attention mass target, KL loss ----

// indices with a leading batch dim, contiguous, every entry -1 or a key index.
at::Tensor checked_indices(const char* op, const at::Tensor& indices, const Batching& b,
                           int64_t num_keys) {
  auto idx = batched(indices, b, indices.scalar_type());
  if (idx.numel() > 0) {
    const auto [lowest, highest] = at::aminmax(idx);
    TORCH_CHECK(lowest.item<int>() >= -1 && highest.item<int>() < num_keys, op,
                ": indices must be -1 or in [0, ", num_keys, ")");
  }
  return idx;
}

// The outputs of index_score_backward's kernel in its dtypes (grad_q in q's where the kernel writes
// it, bf16 or fp32: no copy to convert), and its workspace.
struct IndexScoreGradBuffers {
  IndexScoreGradBuffers(const IndexerArgs& a, const IndexerInputs& in, const at::Tensor& q,
                        bool deterministic)
      : grad_q_bf16(q.scalar_type() == at::kBFloat16),
        grad_q(at::empty(in.q.sizes(),
                         in.q.options().dtype(grad_q_bf16 ? at::kBFloat16 : at::kFloat))),
        grad_k(at::empty(in.k.sizes(), in.k.options().dtype(at::kFloat))),
        grad_w(at::empty_like(in.w)),
        workspace(at::empty({static_cast<int64_t>(cuda::index_score_backward_workspace_bytes(
                                a.shape, deterministic))},
                            q.options().dtype(at::kByte))) {}
  // The gradients in the inputs' dtypes and batch layout.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> in_dtypes_of(const Batching& b,
                                                              const at::Tensor& q,
                                                              const at::Tensor& k,
                                                              const at::Tensor& w) const {
    return {unbatch(grad_q, b).to(q.scalar_type()), unbatch(grad_k, b).to(k.scalar_type()),
            unbatch(grad_w, b).to(w.scalar_type())};
  }
  bool grad_q_bf16;
  at::Tensor grad_q, grad_k, grad_w, workspace;
};

// q, k, w in the kernels' dtypes, as the forward (index_score_gather, flash_topk) saw them;
// gradients are returned in the inputs' dtypes. grad_k is deterministic (fixed point) when
// torch.use_deterministic_algorithms(True) is in effect, else it sums with fp32 atomics.
std::tuple<at::Tensor, at::Tensor, at::Tensor> index_score_backward(
    const at::Tensor& grad_scores, const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
    const at::Tensor& indices, int64_t q_offset, int64_t tokens_per_key) {
  const char* op = "hyscale::index_score_backward";
  const IndexerBackwardArgs args =
      check_index_score_backward(op, grad_scores, q, k, w, indices, q_offset, tokens_per_key);
  const IndexerArgs& a = args.indexer;
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const c10::cuda::CUDAGuard guard(q.device());
  const IndexerInputs in = indexer_inputs(op, a, q, k, w);
  const auto idx = checked_indices(op, indices, a.batching, a.shape.num_keys);
  const auto& b = a.batching;
  const auto g = batched(grad_scores, b, at::kFloat);
  const IndexScoreGradBuffers out(a, in, q, deterministic);
  for (int64_t i = 0; i < b.batch; ++i) {
    cuda::index_score_backward(
        a.shape, in.q[i].data_ptr(), in.k[i].data_ptr(), in.w[i].data_ptr<float>(),
        idx[i].data_ptr<int32_t>(), args.topk, g[i].data_ptr<float>(), deterministic,
        out.grad_q[i].data_ptr(), out.grad_q_bf16, out.grad_k[i].data_ptr<float>(),
        out.grad_w[i].data_ptr<float>(), out.workspace.data_ptr(), current_stream());
  }
  return out.in_dtypes_of(b, q, k, w);
}

// index_score_backward's kernel with the gates' gradients formed in its tiles from the KL (its
// dtypes and modes): no [N, topk] scores or gradients of the selection are made.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> indexer_loss_backward(
    const at::Tensor& target, const at::Tensor& score_lse, const at::Tensor& grad_loss,
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, const at::Tensor& indices) {
  const char* op = "hyscale::indexer_loss_backward";
  const IndexerBackwardArgs args =
      check_indexer_loss_backward(op, target, score_lse, grad_loss, q, k, w, indices);
  const IndexerArgs& a = args.indexer;
  const Batching& b = a.batching;
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const c10::cuda::CUDAGuard guard(q.device());
  const IndexerInputs in = indexer_inputs(op, a, q, k, w);
  const auto idx = checked_indices(op, indices, b, a.shape.num_keys);
  const auto t = batched(target, b, at::kFloat), lse = batched(score_lse, b, at::kFloat),
             g = batched(grad_loss, b, at::kFloat);
  auto loss = at::empty(lse.sizes(), lse.options());
  const IndexScoreGradBuffers out(a, in, q, deterministic);
  for (int64_t i = 0; i < b.batch; ++i) {
    cuda::indexer_loss_backward(
        a.shape, in.q[i].data_ptr(), in.k[i].data_ptr(), in.w[i].data_ptr<float>(),
        idx[i].data_ptr<int32_t>(), args.topk, t[i].data_ptr<float>(), lse[i].data_ptr<float>(),
        g[i].data_ptr<float>(), deterministic, loss[i].data_ptr<float>(), out.grad_q[i].data_ptr(),
        out.grad_q_bf16, out.grad_k[i].data_ptr<float>(), out.grad_w[i].data_ptr<float>(),
        out.workspace.data_ptr(), current_stream());
  }
  auto [grad_q, grad_k, grad_w] = out.in_dtypes_of(b, q, k, w);
  return {unbatch(loss, b).to(target.scalar_type()), grad_q, grad_k, grad_w};
}

// Query rows per step of the mass: the chunk's gathered keys (rows x topk x d_qk bf16) and logits
// (rows x H x topk fp32) are ~0.9 GB at DeepSeek-V3.2's shape; the GEMMs stay large.
constexpr int64_t kMassChunkRows = 256;

// The mass of one sequence, chunk by chunk: gather the chunk's selected keys, logits = q . key on
// tensor cores (bf16 in, fp32 out), exp(scale * logit - lse) summed over heads, 0 in -1 slots,
// L1-normalised per row. O(rows * topk) memory per chunk, never N x N.
void mass_by_chunks(const at::Tensor& q, const at::Tensor& key, const at::Tensor& indices,
                    const at::Tensor& lse, double scale, const at::Tensor& mass) {
  const int64_t n = q.size(0), topk = indices.size(1), dim = key.size(1);
  for (int64_t first = 0; first < n; first += kMassChunkRows) {
    const int64_t rows = std::min(kMassChunkRows, n - first);
    const auto idx = indices.narrow(0, first, rows);
    const auto keys =
        key.index_select(0, idx.clamp_min(0).reshape(-1).to(at::kLong)).view({rows, topk, dim});
    const auto logits = at::bmm(q.narrow(0, first, rows), keys.transpose(1, 2), at::kFloat);
    auto summed = logits.mul_(scale).sub_(lse.narrow(0, first, rows).unsqueeze(-1)).exp_().sum(1);
    summed.masked_fill_(idx.lt(0), 0.0);
    mass.narrow(0, first, rows).copy_(l1_normalised(summed));
  }
}

// mass [.., N, topk] fp32 from bf16 q / key (as sparse_attn reads them) and fp32 lse.
at::Tensor selected_attention_mass(const at::Tensor& q, const at::Tensor& key,
                                   const at::Tensor& indices, const at::Tensor& lse, double scale) {
  const char* op = "hyscale::selected_attention_mass";
  // value only shapes the output of attention; the mass needs q, key and lse, so key stands in.
  const SparseAttnArgs a = check_sparse_attn(op, q, key, key, indices);
  const auto& s = a.shape;
  const auto& b = a.batching;
  TORCH_CHECK(lse.device() == q.device(), op, ": lse is on ", lse.device(), " but q is on ",
              q.device());
  const c10::cuda::CUDAGuard guard(q.device());
  const auto vq = batched(q, b, at::kBFloat16), vk = batched(key, b, at::kBFloat16),
             vl = batched(lse, b, at::kFloat);
  check_sizes(op, "lse", vl, {b.batch, s.num_queries, s.heads});
  const auto idx = checked_indices(op, indices, b, s.num_keys);
  auto mass = at::empty({b.batch, s.num_queries, s.topk}, vq.options().dtype(at::kFloat));
  for (int64_t i = 0; i < b.batch; ++i) mass_by_chunks(vq[i], vk[i], idx[i], vl[i], scale, mass[i]);
  return unbatch(mass, b);
}

// The KL in fp32; the loss is fp32 (fp64 for fp64 scores, as on the CPU).
at::Tensor indexer_kl(const at::Tensor& score, const at::Tensor& target) {
  const char* op = "hyscale::indexer_kl";
  check_kl_args(op, score, target);
  const c10::cuda::CUDAGuard guard(score.device());
  const int64_t topk = score.size(-1), rows = score.numel() / topk;
  const auto s = score.to(at::kFloat).contiguous(), t = target.to(at::kFloat).contiguous();
  auto loss = at::empty({rows}, s.options());
  cuda::indexer_kl_fwd(rows, topk, s.data_ptr<float>(), t.data_ptr<float>(), loss.data_ptr<float>(),
                       current_stream());
  return loss.view(score.sizes().slice(0, score.dim() - 1)).to(cpu_compute_dtype(score));
}

at::Tensor indexer_kl_backward(const at::Tensor& grad_loss, const at::Tensor& score,
                               const at::Tensor& target) {
  const char* op = "hyscale::indexer_kl_backward";
  check_kl_args(op, score, target);
  check_sizes(op, "grad_loss", grad_loss, score.sizes().slice(0, score.dim() - 1));
  TORCH_CHECK(grad_loss.device() == score.device(), op, ": grad_loss is on ", grad_loss.device(),
              " but score is on ", score.device());
  const c10::cuda::CUDAGuard guard(score.device());
  const int64_t topk = score.size(-1), rows = score.numel() / topk;
  const auto s = score.to(at::kFloat).contiguous(), t = target.to(at::kFloat).contiguous();
  const auto g = grad_loss.to(at::kFloat).contiguous();
  auto grad_score = at::empty_like(s);
  cuda::indexer_kl_bwd(rows, topk, s.data_ptr<float>(), t.data_ptr<float>(), g.data_ptr<float>(),
                       grad_score.data_ptr<float>(), current_stream());
  return grad_score.to(score.scalar_type());
}

// ---- The dense warm-up's indexer loss ----------------------------------------------------------

// What the loss keeps of a block of rows: its fp32 attention logits [rows, H, keys] near
// kDenseBlockBytes (32 rows at 128K with H = 64, where the target is made from logits), and its
// [rows, keys] tables (target, scores, their gradient, the gates' head bits, the visibility mask:
// under kDenseBytesPerPair a pair) near kDenseTableBlockBytes, in blocks of more rows (whole waves
// of the index-score backward's rows kernel, by the runtime's occupancy). The tables' blocks are
// large because the row-parallel passes (the scores, four rows a block; the KL, a row a block)
// fill the GPU only with enough rows: 1980 at 128K on an H100, where 396 left the scores at
// 99 blocks for 264 places (406 ms of a layer's 2734 at 128K, 1.6x the 32K rate a pair).
constexpr int64_t kDenseBlockBytes = int64_t(1) << 30;
constexpr int64_t kDenseTableBlockBytes = int64_t(6) << 30;
constexpr int64_t kDenseBytesPerPair = 24;
constexpr int64_t kMaxDenseBlockRows = 4096;  // short sequences: blocks of rows still end

// The [rows, keys] words of gate bits that index_score_table writes, held in an int64 tensor.
uint64_t* gate_words(const at::Tensor& gates) {
  return reinterpret_cast<uint64_t*>(gates.data_ptr<int64_t>());
}

// target [rows, keys] (where each row sees the key; the KL reads no other entry) of rows [first,
// first + rows) of one sequence: the frozen attention's probabilities summed over heads, divided
// by H. For a shape the tensor-core passes take, tile by tile (dense_attention_target_fused) with
// the log-sum-exps given (`lse` [N, H], fp32, contiguous: the trainer's) or else made by the same
// tiles first (dense_attention_lse_fused), no logits in memory; otherwise from logits made by
// cuBLAS (bf16 in, fp32 out) a few rows at a time, read once for their log-sum-exps unless given,
// and once for the target.
void dense_target(const IndexerShape& shape, const at::Tensor& q, const at::Tensor& key,
                  const at::Tensor& lse, double scale, int64_t first, int64_t rows,
                  const at::Tensor& target) {
  const int64_t heads = q.size(1), dim = q.size(2), keys = target.size(1);
  if (cuda::dense_attention_target_fused_supported(heads, dim)) {
    const int64_t seen = shape.visible_keys(first + rows - 1);
    const void* const block_q = q.narrow(0, first, rows).data_ptr();
    at::Tensor block_lse;
    if (lse.defined()) {
      block_lse = lse.narrow(0, first, rows);
    } else {
      block_lse = at::empty({rows, heads}, target.options());
      const auto workspace = at::empty(
          {cuda::dense_attention_lse_fused_workspace(rows, heads, seen)}, target.options());
      cuda::dense_attention_lse_fused(shape, first, rows, heads, dim, seen, block_q, key.data_ptr(),
                                      static_cast<float>(scale), workspace.data_ptr<float>(),
                                      block_lse.data_ptr<float>(), current_stream());
    }
    cuda::dense_attention_target_fused(
        shape, first, rows, heads, dim, seen, block_q, key.data_ptr(), static_cast<float>(scale),
        block_lse.data_ptr<float>(), target.data_ptr<float>(), keys, current_stream());
    return;
  }
  const int64_t step = std::clamp<int64_t>(kDenseBlockBytes / (heads * keys * 4), 1, rows);
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t part = std::min(step, rows - begin);
    const int64_t seen = shape.visible_keys(first + begin + part - 1);
    if (seen == 0) continue;
    const auto logits = at::bmm(q.narrow(0, first + begin, part).reshape({1, part * heads, -1}),
                                key.narrow(0, 0, seen).t().unsqueeze(0), at::kFloat);
    at::Tensor part_lse;
    if (lse.defined()) {
      part_lse = lse.narrow(0, first + begin, part);
    } else {
      part_lse = at::empty({part, heads}, target.options());
      cuda::dense_attention_lse(shape, first + begin, part, heads, seen, logits.data_ptr<float>(),
                                static_cast<float>(scale), part_lse.data_ptr<float>(),
                                current_stream());
    }
    cuda::dense_attention_target(shape, first + begin, part, heads, seen, logits.data_ptr<float>(),
                                 static_cast<float>(scale), part_lse.data_ptr<float>(),
                                 target.narrow(0, begin, part).data_ptr<float>(), keys,
                                 current_stream());
  }
}

// dense_indexer_kl (kernels/dense_indexer_kl.h) on the GPU, a block of query rows at a time over
// the keys its last row sees: the target (dense_target, with the given lse if any); the indexer's
// scores by flash_topk's
// scoring (index_score_table), their log-sum-exp, the KL and its gradient with respect to the
// scores; then the indexer's gradients (dense_index_score_backward: grad_q_I and grad_w three
// rows a block, grad_k_I key tiles a block, no reductions). Memory is O(rows * keys) a block, never
// [N, M].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dense_indexer_kl(
    const at::Tensor& q, const at::Tensor& key, const at::Tensor& q_I, const at::Tensor& k_I,
    const at::Tensor& w, double scale, int64_t q_offset, int64_t tokens_per_key,
    const c10::optional<at::Tensor>& known_lse) {
  const char* op = "hyscale::dense_indexer_kl";
  const DenseIndexerArgs a =
      check_dense_indexer_kl(op, q, key, q_I, k_I, w, q_offset, tokens_per_key, known_lse);
  const IndexerShape& shape = a.shape.indexer;
  const Batching& b = a.batching;
  const int64_t n = shape.num_queries;
  const c10::cuda::CUDAGuard guard(q.device());
  const IndexerInputs in = indexer_inputs(op, IndexerArgs{shape, b}, q_I, k_I, w);
  const auto vq = batched(q, b, at::kBFloat16), vkey = batched(key, b, at::kBFloat16);
  const auto f32 = vq.options().dtype(at::kFloat);
  const auto vlse = known_lse ? batched(*known_lse, b, at::kFloat) : at::Tensor();
  auto loss = at::zeros({b.batch, n}, f32);
  auto grad_q = at::zeros(in.q.sizes(), f32);
  auto grad_k = at::zeros(in.k.sizes(), f32);
  auto grad_w = at::zeros(in.w.sizes(), f32);
  // Whole waves of the index-score backward's query-major kernel (three rows a block, one block
  // an SM), where a block holds more than one.
  const int64_t wave = cuda::dense_index_score_backward_rows_per_wave(shape.heads, shape.dim);
  int64_t block_rows = std::clamp<int64_t>(
      kDenseTableBlockBytes / (std::max<int64_t>(1, shape.num_keys) * kDenseBytesPerPair), 1,
      kMaxDenseBlockRows);
  if (block_rows > wave) block_rows -= block_rows % wave;
  for (int64_t seq = 0; seq < b.batch; ++seq) {
    for (int64_t first = 0; first < n; first += block_rows) {
      const int64_t rows = std::min(block_rows, n - first);
      const int64_t keys = shape.visible_keys(first + rows - 1);  // rows see prefixes
      if (keys == 0) continue;                                    // loss 0, gradients 0
      // The tables' rows start on 16 bytes (the index-score backward reads them with the TMA
      // unit; the KL with 16-byte loads). Each is written where its row sees the key and read
      // nowhere else, so none is filled first.
      const int64_t stride = (keys + 3) / 4 * 4;
      auto target = at::empty({rows, stride}, f32);
      const auto gates = at::empty({rows, stride}, vq.options().dtype(at::kLong));
      dense_target(shape, vq[seq], vkey[seq], vlse.defined() ? vlse[seq] : vlse, scale, first, rows,
                   target);

      {
        // The indexer's scores over the same keys (-infinity where the row does not see the
        // key) and their ReLU gates, then the KL and, in the target's place, d loss / d score =
        // softmax - target.
        IndexerShape scored = shape;
        scored.num_keys = keys;
        const auto scores = at::empty({rows, stride}, f32);
        cuda::index_score_table(scored, in.q[seq].data_ptr(), in.k[seq].data_ptr(),
                                in.w[seq].data_ptr<float>(), first, rows, scores.data_ptr<float>(),
                                gate_words(gates), stride, current_stream());
        cuda::dense_indexer_kl_rows(
            rows, keys, scores.data_ptr<float>(), stride, target.data_ptr<float>(), stride,
            loss[seq].narrow(0, first, rows).data_ptr<float>(), current_stream());
      }
      const auto& grad_scores = target;

      IndexerShape block = shape;
      block.num_queries = rows;
      block.num_keys = keys;
      block.q_offset = shape.position(first);
      cuda::dense_index_score_backward(
          block, in.q[seq].narrow(0, first, rows).data_ptr(), in.k[seq].data_ptr(),
          in.w[seq].narrow(0, first, rows).data_ptr<float>(), grad_scores.data_ptr<float>(),
          gate_words(gates), stride, grad_q[seq].narrow(0, first, rows).data_ptr<float>(),
          grad_k[seq].data_ptr<float>(), grad_w[seq].narrow(0, first, rows).data_ptr<float>(),
          current_stream());
    }
  }
  return {unbatch(loss, b), unbatch(grad_q, b).to(q_I.scalar_type()),
          unbatch(grad_k, b).to(k_I.scalar_type()), unbatch(grad_w, b).to(w.scalar_type())};
}

int64_t dense_indexer_kl_row_multiple(const at::Tensor& q_I) {
  const char* op = "hyscale::dense_indexer_kl_row_multiple";
  TORCH_CHECK(q_I.dim() >= 2, op, ": q_I must be [.., H_I, d_I], got ", q_I.sizes());
  const int64_t heads = q_I.size(-2), dim = q_I.size(-1);
  TORCH_CHECK(cuda_indexer_shape_supported(heads, dim), op, ": the CUDA kernels take ",
              kCudaIndexerShapes, ", got H_I = ", heads, ", d_I = ", dim);
  const c10::cuda::CUDAGuard guard(q_I.device());
  return cuda::dense_index_score_backward_rows_per_wave(heads, dim);
}

}  // namespace

}  // namespace hyscale::torch_ops

TORCH_LIBRARY_IMPL(hyscale, CUDA, m) {
  using namespace hyscale::torch_ops;
  m.impl("flash_topk", &flash_topk);
  m.impl("quantize_e4m3", &quantize_e4m3);
  m.impl("index_score_gather", &index_score_gather);
  m.impl("index_score_table", &index_score_table);
  m.impl("sparse_attn", &sparse_attn);
  m.impl("sparse_attn_backward", &sparse_attn_backward);
  m.impl("sparse_attn_grouped", &sparse_attn_grouped);
  m.impl("sparse_attn_backward_grouped", &sparse_attn_backward_grouped);
  m.impl("sparse_attn_latent", &sparse_attn_latent);
  m.impl("sparse_attn_latent_backward", &sparse_attn_latent_backward);
  m.impl("index_score_backward", &index_score_backward);
  m.impl("selected_attention_mass", &selected_attention_mass);
  m.impl("sparse_attn_latent_backward_target", &sparse_attn_latent_backward_target);
  m.impl("indexer_kl", &indexer_kl);
  m.impl("indexer_kl_backward", &indexer_kl_backward);
  m.impl("indexer_loss_backward", &indexer_loss_backward);
  m.impl("dense_indexer_kl", &dense_indexer_kl);
  m.impl("dense_indexer_kl_row_multiple", &dense_indexer_kl_row_multiple);
}
