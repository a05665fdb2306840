#include "worker/calibrate/benchmarks.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "kernels/torch/ops.h"
#include "planner/flops.h"
#include "proto/constants.h"
#include "worker/calibrate/selection.h"

#ifdef HYSCALE_HAVE_CUDA
#include "kernels/cuda/sparse_attn_cuda.h"
#endif

namespace hyscale::calibrate {
namespace {

using server::planner::AttentionFlops;
using server::planner::CausalPairs;
using server::planner::DenseIndexerLossFlops;
using server::planner::IndexerMassFlops;
using server::planner::IndexScoreBackwardFlops;
using server::planner::kBackwardFlops;
using server::planner::SelectionFlops;

constexpr uint64_t kSelectionSeed = 1;
constexpr int kLaunchCalls = 1000;  // per timed run: one call is below the clock's resolution

// The CUDA-only benchmark ops of kernels/torch/library.cc, which ops.h does not wrap.
template <typename Signature>
c10::TypedOperatorHandle<Signature> Op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using TableOp = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                           int64_t, int64_t, int64_t);
using GroupedFwdOp = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, const at::Tensor&,
                                                        double, int64_t);
using GroupedBwdOp = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    double, const at::Tensor&, const at::Tensor&, int64_t, bool);

struct IndexerInputs {
  at::Tensor q, k, w;
};

// Random (untrained-indexer) inputs for n tokens, as docs/performance.md's FlashTopK figures.
IndexerInputs MakeIndexerInputs(const Shapes& s, int64_t n, const at::TensorOptions& options) {
  IndexerInputs in;
  in.q = at::randn({n, s.indexer_heads, s.indexer_dim}, options);
  in.k = at::randn({n, s.indexer_dim}, options);
  in.w = at::randn({n, s.indexer_heads}, options.dtype(at::kFloat)) /
         std::sqrt(static_cast<double>(s.indexer_heads * s.indexer_dim));
  return in;
}

struct AttentionInputs {
  at::Tensor q, key, value, grad_out;
};

AttentionInputs MakeAttentionInputs(const Shapes& s, int64_t rows,
                                    const at::TensorOptions& options) {
  AttentionInputs in;
  in.q = at::randn({rows, s.heads, s.dim_qk}, options);
  in.key = at::randn({s.seq_len, s.dim_qk}, options);
  in.value = at::randn({s.seq_len, s.dim_v}, options);
  in.grad_out = at::randn({rows, s.heads, s.dim_v}, options);
  return in;
}

// bench/sparse_attn_bench.py's gather_attn for one block of queries: [c, H, d_v]. The keys are
// gathered by advanced indexing, as there: its backward (an accumulating index_put) is most of
// the baseline's backward time, far more than index_select's would be.
at::Tensor GatherAttention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                           const at::Tensor& indices, double scale) {
  const at::Tensor slots = indices.to(at::kLong);
  const at::Tensor safe = slots.clamp_min(0);
  const at::Tensor keys = key.index({safe});                                    // [c, k, d_qk]
  const at::Tensor values = value.index({safe});                                // [c, k, d_v]
  at::Tensor logits = at::bmm(q, keys.transpose(1, 2)).to(at::kFloat) * scale;  // [c, H, k]
  logits = logits.masked_fill(slots.lt(0).unsqueeze(1), -std::numeric_limits<double>::infinity());
  return at::bmm(at::softmax(logits, -1).to(q.scalar_type()), values);
}

// The attention's log-sum-exps [N, H] (fp32) over each row's causal prefix, as the trainer's output
// pass hands them to the dense loss (which then forms its target on tensor cores), a few rows at
// a time so that the logits stay near 1 GiB.
at::Tensor DenseAttentionLse(const at::Tensor& q, const at::Tensor& key, double scale) {
  const int64_t n = q.size(0), heads = q.size(1);
  const int64_t step = std::max<int64_t>(1, (int64_t(1) << 28) / std::max<int64_t>(1, heads * n));
  at::Tensor lse = at::empty({n, heads}, q.options().dtype(at::kFloat));
  const at::Tensor positions = at::arange(n, q.options().dtype(at::kLong));
  for (int64_t first = 0; first < n; first += step) {
    const int64_t rows = std::min(step, n - first), keys = first + rows;
    const at::Tensor logits = at::einsum("thd,sd->ths", {q.narrow(0, first, rows).to(at::kFloat),
                                                         key.narrow(0, 0, keys).to(at::kFloat)}) *
                              scale;
    const at::Tensor hidden =
        positions.narrow(0, 0, keys).unsqueeze(0).gt(positions.narrow(0, first, rows).unsqueeze(1));
    lse.narrow(0, first, rows)
        .copy_(logits.masked_fill(hidden.unsqueeze(1), -std::numeric_limits<double>::infinity())
                   .logsumexp(-1));
  }
  return lse;
}

}  // namespace

Benchmarks::Benchmarks(c10::Device device, const Shapes& shapes)
    : device_(device),
      shapes_(shapes),
      timer_(device, shapes.warmup, shapes.runs),
      dtype_(device.is_cuda() ? at::kBFloat16 : at::kFloat),
      indices_(LocalSelection(shapes.seq_len, shapes.topk, kSelectionSeed).to(device)) {}

at::TensorOptions Benchmarks::Options(c10::ScalarType dtype) const {
  return at::TensorOptions().device(device_).dtype(dtype);
}

Measurement Benchmarks::Dense() const {
  const int64_t n = shapes_.dense_size;
  const at::Tensor a = at::randn({n, n}, Options(dtype_)), b = at::randn({n, n}, Options(dtype_));
  at::Tensor c = at::empty({n, n}, Options(dtype_));
  const double seconds = timer_.Median([&] { at::mm_out(c, a, b); });
  return {seconds, 2.0 * n * n * n};
}

Measurement Benchmarks::Copy() const {
  const at::Tensor src = at::ones({shapes_.copy_bytes}, Options(at::kByte));
  at::Tensor dst = at::empty_like(src);
  const double seconds = timer_.Median([&] { dst.copy_(src); });
  return {seconds, 2.0 * static_cast<double>(shapes_.copy_bytes)};
}

Measurement Benchmarks::FlashTopk(bool fp8) const {
  const IndexerInputs in = MakeIndexerInputs(shapes_, shapes_.selection_seq_len, Options(dtype_));
  const double seconds =
      timer_.Median([&] { ops::flash_topk(in.q, in.k, in.w, shapes_.topk, 0, 1, fp8); });
  return {seconds, SelectionFlops(shapes_.indexer_heads, shapes_.indexer_dim,
                                  CausalPairs(static_cast<double>(shapes_.selection_seq_len)))};
}

Measurement Benchmarks::TableTopk() const {
  const IndexerInputs in = MakeIndexerInputs(shapes_, shapes_.selection_seq_len, Options(dtype_));
  const int64_t n = shapes_.selection_seq_len, topk = std::min(shapes_.topk, n);
  const at::Tensor keys_f = in.k.to(at::kFloat).t();  // [d_I, N]
  const at::Tensor positions = at::arange(n, Options(at::kLong));
  // One block's fp32 score table [rows, N], -inf where a key is not visible.
  const auto table = [&](int64_t row, int64_t rows) -> at::Tensor {
    if (device_.is_cuda()) {
      static const auto op = Op<TableOp>("hyscale::index_score_table");
      return op.call(in.q, in.k, in.w, row, rows, 0, 1);
    }
    const at::Tensor q = in.q.slice(0, row, row + rows).to(at::kFloat);
    const at::Tensor logits =  // [rows, H_I, N]
        at::matmul(q.reshape({rows * shapes_.indexer_heads, shapes_.indexer_dim}), keys_f)
            .relu_()
            .view({rows, shapes_.indexer_heads, n});
    at::Tensor scores = at::bmm(in.w.slice(0, row, row + rows).unsqueeze(1), logits).squeeze(1);
    const at::Tensor hidden =
        positions.unsqueeze(0).gt(positions.slice(0, row, row + rows).unsqueeze(1));
    return scores.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  };
  at::Tensor indices = at::empty({n, topk}, Options(at::kInt));
  at::Tensor scores = at::empty({n, topk}, Options(at::kFloat));
  const double seconds = timer_.Median([&] {
    for (int64_t row = 0; row < n; row += shapes_.table_block_rows) {
      const int64_t rows = std::min(shapes_.table_block_rows, n - row);
      auto [s, i] = at::topk(table(row, rows), topk, 1);
      scores.slice(0, row, row + rows).copy_(s);
      indices.slice(0, row, row + rows).copy_(i);
    }
  });
  return {seconds, SelectionFlops(shapes_.indexer_heads, shapes_.indexer_dim,
                                  CausalPairs(static_cast<double>(n)))};
}

std::vector<int> Benchmarks::Groups() const {
  std::vector<int> groups = {1};
#ifdef HYSCALE_HAVE_CUDA
  if (device_.is_cuda()) {
    groups.clear();
    for (int g : kQueryGroups) {
      if (cuda::sparse_attn_group_supported(g, shapes_.topk)) groups.push_back(g);
    }
  }
#endif
  return groups;
}

SparseAttentionMeasurement Benchmarks::SparseAttention(int group) const {
  const AttentionInputs in = MakeAttentionInputs(shapes_, shapes_.seq_len, Options(dtype_));
  const double scale = 1 / std::sqrt(static_cast<double>(shapes_.dim_qk));
  SparseAttentionMeasurement m;
  m.group = group;
  m.dedup = DedupFactor(indices_, group);
  const auto forward = [&]() -> std::tuple<at::Tensor, at::Tensor> {
    if (device_.is_cuda()) {
      static const auto op = Op<GroupedFwdOp>("hyscale::sparse_attn_grouped");
      return op.call(in.q, in.key, in.value, indices_, scale, group);
    }
    auto attention = ops::sparse_attn(in.q, in.key, in.value, indices_, scale);
    return {attention.out, attention.lse};
  };
  at::Tensor out, lse;
  std::tie(out, lse) = forward();
  const auto backward = [&] {
    if (device_.is_cuda()) {
      static const auto op = Op<GroupedBwdOp>("hyscale::sparse_attn_backward_grouped");
      op.call(in.grad_out, in.q, in.key, in.value, indices_, scale, out, lse, group, false);
    } else {
      ops::sparse_attn_backward(in.grad_out, in.q, in.key, in.value, indices_, scale, out, lse);
    }
  };
  const double valid = static_cast<double>(indices_.ge(0).sum().item<int64_t>());
  const double executed =
      AttentionFlops(shapes_.heads, shapes_.dim_qk, shapes_.dim_v, valid * group / m.dedup);
  m.fwd = {timer_.Median([&] { forward(); }), executed};
  m.bwd = {timer_.Median(backward), kBackwardFlops * executed};
  return m;
}

LatentMeasurement Benchmarks::Latent() const {
  const AttentionInputs in = MakeAttentionInputs(shapes_, shapes_.seq_len, Options(dtype_));
  const double scale = 1 / std::sqrt(static_cast<double>(shapes_.dim_qk));
  const int64_t dim_v = shapes_.dim_v;
  const auto forward = [&] {
    return ops::sparse_attn_latent(in.q, in.key, indices_, scale, dim_v);
  };
  const ops::Attention attention = forward();
  const double valid = static_cast<double>(indices_.ge(0).sum().item<int64_t>());
  const double flops = AttentionFlops(shapes_.heads, shapes_.dim_qk, dim_v, valid);
  LatentMeasurement m;
  m.fwd = {timer_.Median([&] { forward(); }), flops};
  m.bwd = {timer_.Median([&] {
             ops::sparse_attn_latent_backward(in.grad_out, in.q, in.key, indices_, scale, dim_v,
                                              attention.out, attention.lse);
           }),
           kBackwardFlops * flops};
  const double with_target = timer_.Median([&] {
    ops::sparse_attn_latent_backward_target(in.grad_out, in.q, in.key, indices_, scale, dim_v,
                                            attention.out, attention.lse);
  });
  // The difference of two medians: floored so that noise cannot make it zero or negative.
  m.target = {
      std::max(with_target - m.bwd.seconds, 1e-3 * m.bwd.seconds),
      IndexerMassFlops(shapes_.heads, shapes_.dim_qk, static_cast<double>(indices_.numel()))};
  return m;
}

GatherMeasurement Benchmarks::Gather() const {
  const int64_t rows = shapes_.gather_rows, first = shapes_.seq_len - rows;
  const AttentionInputs in = MakeAttentionInputs(shapes_, rows, Options(dtype_));
  const at::Tensor indices = indices_.slice(0, first, shapes_.seq_len);
  const double scale = 1 / std::sqrt(static_cast<double>(shapes_.dim_qk));
  const int64_t chunk = shapes_.gather_chunk;
  const auto forward = [&] {
    for (int64_t lo = 0; lo < rows; lo += chunk) {
      const int64_t hi = std::min(rows, lo + chunk);
      GatherAttention(in.q.slice(0, lo, hi), in.key, in.value, indices.slice(0, lo, hi), scale);
    }
  };
  const auto forward_backward = [&] {
    const at::Tensor key = in.key.detach().requires_grad_(true);
    const at::Tensor value = in.value.detach().requires_grad_(true);
    for (int64_t lo = 0; lo < rows; lo += chunk) {
      const int64_t hi = std::min(rows, lo + chunk);
      const at::Tensor q = in.q.slice(0, lo, hi).detach().requires_grad_(true);
      GatherAttention(q, key, value, indices.slice(0, lo, hi), scale)
          .backward(in.grad_out.slice(0, lo, hi));
    }
  };
  const double valid = static_cast<double>(indices.ge(0).sum().item<int64_t>());
  const double flops = AttentionFlops(shapes_.heads, shapes_.dim_qk, shapes_.dim_v, valid);
  GatherMeasurement m;
  m.fwd = {timer_.Median(forward), flops};
  const double both = timer_.Median(forward_backward);
  // The difference of two medians: floored so that noise cannot make it zero or negative.
  m.bwd = {std::max(both - m.fwd.seconds, 1e-3 * both), kBackwardFlops * flops};
  return m;
}

IndexerLossMeasurement Benchmarks::IndexerLoss() const {
  const int64_t n = shapes_.seq_len;
  const IndexerInputs indexer = MakeIndexerInputs(shapes_, n, Options(dtype_));
  const ops::Selection selection = ops::flash_topk(indexer.q, indexer.k, indexer.w, shapes_.topk);
  const at::Tensor& indices = selection.indices;
  const at::Tensor score_lse = selection.scores.logsumexp(-1);
  const AttentionInputs in = MakeAttentionInputs(shapes_, n, Options(dtype_));
  const double scale = 1 / std::sqrt(static_cast<double>(shapes_.dim_qk));
  const at::Tensor lse = ops::sparse_attn(in.q, in.key, in.value, indices, scale).lse;
  const at::Tensor target = ops::selected_attention_mass(in.q, in.key, indices, lse, scale);
  const at::Tensor grad_loss = at::full({n}, 1.0 / static_cast<double>(n), Options(at::kFloat));
  const double slots = static_cast<double>(indices.numel());
  IndexerLossMeasurement m;
  m.mass = {timer_.Median([&] { ops::selected_attention_mass(in.q, in.key, indices, lse, scale); }),
            IndexerMassFlops(shapes_.heads, shapes_.dim_qk, slots)};
  m.score_bwd = {timer_.Median([&] {
                   ops::indexer_loss_backward(target, score_lse, grad_loss, indexer.q, indexer.k,
                                              indexer.w, indices);
                 }),
                 IndexScoreBackwardFlops(shapes_.indexer_heads, shapes_.indexer_dim, slots)};
  return m;
}

Measurement Benchmarks::DenseIndexerLoss() const {
  const int64_t n = shapes_.dense_loss_seq_len;
  const IndexerInputs indexer = MakeIndexerInputs(shapes_, n, Options(dtype_));
  const at::Tensor q = at::randn({n, shapes_.heads, shapes_.dim_qk}, Options(dtype_));
  const at::Tensor key = at::randn({n, shapes_.dim_qk}, Options(dtype_));
  const double scale = 1 / std::sqrt(static_cast<double>(shapes_.dim_qk));
  const at::Tensor lse = DenseAttentionLse(q, key, scale);
  const double seconds = timer_.Median(
      [&] { ops::dense_indexer_kl(q, key, indexer.q, indexer.k, indexer.w, scale, 0, 1, lse); });
  return Measurement{
      seconds, DenseIndexerLossFlops(shapes_.heads, shapes_.dim_qk, shapes_.indexer_heads,
                                     shapes_.indexer_dim, CausalPairs(static_cast<double>(n)))};
}

double Benchmarks::KernelLaunch() const {
  at::Tensor x = at::zeros({1}, Options(at::kFloat));
  return timer_.Median([&] {
    for (int i = 0; i < kLaunchCalls; ++i) x.add_(1);
  }) / kLaunchCalls;
}

}  // namespace hyscale::calibrate
