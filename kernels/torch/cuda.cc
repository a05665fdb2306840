// CUDA implementations of the hyscale ops (built when HyScale is configured with CUDA): argument
// checks shared with the CPU backend, dtype conversion to what the kernels take (bf16 q/k, fp32
// w), and the per-sequence calls into kernels/cuda.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "kernels/cuda/flash_topk_cuda.h"
#include "kernels/torch/checks.h"

namespace hyscale::torch_ops {
namespace {

// Per-sequence inputs in the kernels' dtypes, with a leading batch dim.
struct IndexerInputs {
  at::Tensor q, k, w;
};

IndexerInputs indexer_inputs(const char* op, const IndexerArgs& a, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& w) {
  TORCH_CHECK(cuda::indexer_shape_supported(a.shape.heads, a.shape.dim), op,
              ": the CUDA kernels take H_I in {16, 32, 64} and d_I in {64, 128}, got H_I = ",
              a.shape.heads, ", d_I = ", a.shape.dim);
  auto batched = [&](const at::Tensor& t) { return a.batching.batched ? t : t.unsqueeze(0); };
  return {batched(q).to(at::kBFloat16).contiguous(), batched(k).to(at::kBFloat16).contiguous(),
          batched(w).to(at::kFloat).contiguous()};
}

at::Tensor unbatch(const at::Tensor& t, const Batching& b) {
  return b.batched ? t : t.squeeze(0);
}

cuda::Stream current_stream() {
  return at::cuda::getCurrentCUDAStream().stream();
}

std::tuple<at::Tensor, at::Tensor> flash_topk(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& w, int64_t topk, int64_t q_offset,
                                              int64_t tokens_per_key) {
  const char* op = "hyscale::flash_topk";
  const IndexerArgs a = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  TORCH_CHECK(topk >= 1 && topk <= cuda::kMaxTopk, op, ": topk must be in [1, ", cuda::kMaxTopk,
              "] on CUDA, got ", topk);
  const c10::cuda::CUDAGuard guard(q.device());
  const IndexerInputs in = indexer_inputs(op, a, q, k, w);
  const int64_t n = a.shape.num_queries;
  auto indices = at::empty({a.batching.batch, n, topk}, q.options().dtype(at::kInt));
  auto scores = at::empty({a.batching.batch, n, topk}, q.options().dtype(at::kFloat));
  auto workspace =
      at::empty({static_cast<int64_t>(cuda::flash_topk_workspace_bytes(a.shape, topk))},
                q.options().dtype(at::kByte));
  for (int64_t b = 0; b < a.batching.batch; ++b) {
    cuda::flash_topk(a.shape, in.q[b].data_ptr(), in.k[b].data_ptr(), in.w[b].data_ptr<float>(),
                     topk, indices[b].data_ptr<int32_t>(), scores[b].data_ptr<float>(),
                     workspace.data_ptr(), current_stream());
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
  const auto idx = (a.batching.batched ? indices : indices.unsqueeze(0)).contiguous();
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
                          row_begin, rows, table.data_ptr<float>(), current_stream());
  return table;
}

}  // namespace
}  // namespace hyscale::torch_ops

TORCH_LIBRARY_IMPL(hyscale, CUDA, m) {
  using namespace hyscale::torch_ops;
  m.impl("flash_topk", &flash_topk);
  m.impl("index_score_gather", &index_score_gather);
  m.impl("index_score_table", &index_score_table);
}
