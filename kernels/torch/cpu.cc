// CPU implementations of the hyscale ops: convert to the compute dtype, run the plain-C++ kernels
// of kernels/cpu per sequence, convert back.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "kernels/dense_indexer_kl.h"
#include "kernels/flash_topk.h"
#include "kernels/fp8.h"
#include "kernels/index_score.h"
#include "kernels/indexer_kl.h"
#include "kernels/sparse_attn.h"
#include "kernels/torch/checks.h"

namespace hyscale::torch_ops {
namespace {

// A contiguous tensor in the compute dtype with a leading batch dim, and typed per-sequence
// pointers into it.
class SeqView {
 public:
  SeqView(const at::Tensor& t, const Batching& b, at::ScalarType dtype)
      : t_((b.batched ? t : t.unsqueeze(0)).to(dtype).contiguous()) {}
  template <typename T>
  T* at(int64_t b) const {
    return t_.data_ptr<T>() + b * t_.stride(0);
  }
  const at::Tensor& tensor() const { return t_; }

 private:
  at::Tensor t_;
};

at::Tensor unbatch(const at::Tensor& t, const Batching& b) {
  return b.batched ? t : t.squeeze(0);
}

std::vector<int64_t> batched_sizes(const Batching& b, std::initializer_list<int64_t> sizes) {
  std::vector<int64_t> out{b.batch};
  out.insert(out.end(), sizes);
  return out;
}

CpuContext cpu_context() {
  return CpuContext{at::get_num_threads()};
}

std::tuple<at::Tensor, at::Tensor> quantize_e4m3(const at::Tensor& x) {
  const char* op = "hyscale::quantize_e4m3";
  check_e4m3_input(op, x);
  const auto values_in = x.to(at::kFloat).contiguous();
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  auto values = at::empty(x.sizes(), x.options().dtype(at::kByte));
  auto scales = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  quantize_rows_e4m3(values_in.data_ptr<float>(), rows, dim, values.data_ptr<uint8_t>(),
                     scales.data_ptr<float>());
  return {values, scales};
}

// e4m3 bits -> their values (unscaled), as fp32.
at::Tensor e4m3_values(const at::Tensor& bits) {
  std::array<float, 256> table;
  for (int i = 0; i < 256; ++i) table[i] = e4m3_to_float(static_cast<uint8_t>(i));
  const auto lookup = at::from_blob(table.data(), {256}, at::kFloat);
  return lookup.index_select(0, bits.flatten().to(at::kLong)).reshape(bits.sizes());
}

// The indexer inputs flash_topk scores: as given, or their fp8 quantization dequantized, with
// the query rows' scales in the weights (I = sum_h (w q_scale) ReLU(q8 . (k8 k_scale))).
struct ScoredInputs {
  at::Tensor q, k, w;
};
ScoredInputs scored_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                           bool fp8) {
  if (!fp8) return {q, k, w};
  const auto [q_bits, q_scales] = quantize_e4m3(q);
  const auto [k_bits, k_scales] = quantize_e4m3(k);
  return {e4m3_values(q_bits), e4m3_values(k_bits) * k_scales.unsqueeze(-1),
          w.to(at::kFloat) * q_scales};
}

std::tuple<at::Tensor, at::Tensor> flash_topk(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& w, int64_t topk, int64_t q_offset,
                                              int64_t tokens_per_key, bool fp8) {
  const char* op = "hyscale::flash_topk";
  const IndexerArgs a = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  TORCH_CHECK(topk > 0, op, ": topk must be > 0, got ", topk);
  const auto dtype = cpu_compute_dtype(q);
  const ScoredInputs in = scored_inputs(q, k, w, fp8);
  const SeqView vq(in.q, a.batching, dtype), vk(in.k, a.batching, dtype),
      vw(in.w, a.batching, dtype);
  const auto sizes = batched_sizes(a.batching, {a.shape.num_queries, topk});
  const SeqView indices(at::empty(sizes, q.options().dtype(at::kInt)), {a.batching.batch, true},
                        at::kInt);
  const SeqView scores(at::empty(sizes, q.options().dtype(dtype)), {a.batching.batch, true}, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "flash_topk", [&] {
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      flash_topk_cpu<scalar_t>(a.shape, vq.at<scalar_t>(b), vk.at<scalar_t>(b), vw.at<scalar_t>(b),
                               topk, indices.at<int32_t>(b), scores.at<scalar_t>(b), cpu_context());
    }
  });
  return {unbatch(indices.tensor(), a.batching), unbatch(scores.tensor(), a.batching)};
}

at::Tensor index_score_gather(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                              const at::Tensor& indices, int64_t q_offset, int64_t tokens_per_key) {
  const char* op = "hyscale::index_score_gather";
  const IndexerArgs a = check_indexer(op, q, k, w, q_offset, tokens_per_key);
  const int64_t topk = check_indices(op, indices, a.batching, a.shape.num_queries, q);
  const auto dtype = cpu_compute_dtype(q);
  const SeqView vq(q, a.batching, dtype), vk(k, a.batching, dtype), vw(w, a.batching, dtype);
  const SeqView vi(indices, a.batching, at::kInt);
  const auto sizes = batched_sizes(a.batching, {a.shape.num_queries, topk});
  const SeqView scores(at::empty(sizes, q.options().dtype(dtype)), {a.batching.batch, true}, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "index_score_gather", [&] {
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      validate_indices(a.shape, vi.at<int32_t>(b), topk);
      index_score_gather_cpu<scalar_t>(a.shape, vq.at<scalar_t>(b), vk.at<scalar_t>(b),
                                       vw.at<scalar_t>(b), vi.at<int32_t>(b), topk,
                                       scores.at<scalar_t>(b), cpu_context());
    }
  });
  return unbatch(scores.tensor(), a.batching);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> index_score_backward(
    const at::Tensor& grad_scores, const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
    const at::Tensor& indices, int64_t q_offset, int64_t tokens_per_key) {
  const IndexerBackwardArgs args = check_index_score_backward(
      "hyscale::index_score_backward", grad_scores, q, k, w, indices, q_offset, tokens_per_key);
  const IndexerArgs& a = args.indexer;
  const int64_t topk = args.topk;
  const auto dtype = cpu_compute_dtype(q);
  const SeqView vq(q, a.batching, dtype), vk(k, a.batching, dtype), vw(w, a.batching, dtype);
  const SeqView vi(indices, a.batching, at::kInt), vg(grad_scores, a.batching, dtype);
  const SeqView gq(at::empty_like(vq.tensor()), {a.batching.batch, true}, dtype);
  const SeqView gk(at::empty_like(vk.tensor()), {a.batching.batch, true}, dtype);
  const SeqView gw(at::empty_like(vw.tensor()), {a.batching.batch, true}, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "index_score_backward", [&] {
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      index_score_backward_cpu<scalar_t>(a.shape, vq.at<scalar_t>(b), vk.at<scalar_t>(b),
                                         vw.at<scalar_t>(b), vi.at<int32_t>(b), topk,
                                         vg.at<scalar_t>(b), gq.at<scalar_t>(b), gk.at<scalar_t>(b),
                                         gw.at<scalar_t>(b), cpu_context());
    }
  });
  return {unbatch(gq.tensor(), a.batching).to(q.scalar_type()),
          unbatch(gk.tensor(), a.batching).to(k.scalar_type()),
          unbatch(gw.tensor(), a.batching).to(w.scalar_type())};
}

void check_index_range(const char* op, const at::Tensor& indices, int64_t num_keys) {
  TORCH_CHECK(indices.ge(-1).logical_and(indices.lt(num_keys)).all().item<bool>(), op,
              ": indices must be -1 or in [0, ", num_keys, ")");
}

std::tuple<at::Tensor, at::Tensor> sparse_attn(const at::Tensor& q, const at::Tensor& key,
                                               const at::Tensor& value, const at::Tensor& indices,
                                               double scale, int64_t group) {
  const char* op = "hyscale::sparse_attn";
  check_query_group(op, group);
  const SparseAttnArgs a = check_sparse_attn(op, q, key, value, indices);
  check_index_range(op, indices, a.shape.num_keys);
  const auto dtype = cpu_compute_dtype(q);
  const SeqView vq(q, a.batching, dtype), vk(key, a.batching, dtype), vv(value, a.batching, dtype);
  const SeqView vi(indices, a.batching, at::kInt);
  const auto& s = a.shape;
  const SeqView out(at::empty(batched_sizes(a.batching, {s.num_queries, s.heads, s.dim_v}),
                              q.options().dtype(dtype)),
                    {a.batching.batch, true}, dtype);
  const SeqView lse(
      at::empty(batched_sizes(a.batching, {s.num_queries, s.heads}), q.options().dtype(dtype)),
      {a.batching.batch, true}, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "sparse_attn", [&] {
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      sparse_attn_fwd_cpu<scalar_t>(s, vq.at<scalar_t>(b), vk.at<scalar_t>(b), vv.at<scalar_t>(b),
                                    vi.at<int32_t>(b), static_cast<scalar_t>(scale),
                                    out.at<scalar_t>(b), lse.at<scalar_t>(b), cpu_context());
    }
  });
  return {unbatch(out.tensor(), a.batching).to(q.scalar_type()), unbatch(lse.tensor(), a.batching)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attn_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& indices, double scale, const at::Tensor& out, const at::Tensor& lse,
    int64_t group) {
  const char* op = "hyscale::sparse_attn_backward";
  check_query_group(op, group);
  const SparseAttnArgs a = check_sparse_attn(op, q, key, value, indices);
  check_index_range(op, indices, a.shape.num_keys);
  check_sizes(op, "out", out, grad_out.sizes());
  const auto& s = a.shape;
  const auto dtype = cpu_compute_dtype(q);
  const SeqView vq(q, a.batching, dtype), vk(key, a.batching, dtype), vv(value, a.batching, dtype);
  const SeqView vi(indices, a.batching, at::kInt), vo(out, a.batching, dtype);
  const SeqView vl(lse, a.batching, dtype), vg(grad_out, a.batching, dtype);
  check_sizes(op, "grad_out", vg.tensor(),
              batched_sizes({a.batching.batch, true}, {s.num_queries, s.heads, s.dim_v}));
  check_sizes(op, "lse", vl.tensor(),
              batched_sizes({a.batching.batch, true}, {s.num_queries, s.heads}));
  const SeqView gq(at::empty_like(vq.tensor()), {a.batching.batch, true}, dtype);
  const SeqView gk(at::empty_like(vk.tensor()), {a.batching.batch, true}, dtype);
  const SeqView gv(at::empty_like(vv.tensor()), {a.batching.batch, true}, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "sparse_attn_backward", [&] {
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      sparse_attn_bwd_cpu<scalar_t>(
          s, vq.at<scalar_t>(b), vk.at<scalar_t>(b), vv.at<scalar_t>(b), vi.at<int32_t>(b),
          static_cast<scalar_t>(scale), vo.at<scalar_t>(b), vl.at<scalar_t>(b), vg.at<scalar_t>(b),
          gq.at<scalar_t>(b), gk.at<scalar_t>(b), gv.at<scalar_t>(b), cpu_context());
    }
  });
  return {unbatch(gq.tensor(), a.batching).to(q.scalar_type()),
          unbatch(gk.tensor(), a.batching).to(key.scalar_type()),
          unbatch(gv.tensor(), a.batching).to(value.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> sparse_attn_latent(const at::Tensor& q, const at::Tensor& kv,
                                                      const at::Tensor& indices, double scale,
                                                      int64_t dim_v, int64_t group) {
  return sparse_attn(q, kv, latent_values("hyscale::sparse_attn_latent", kv, dim_v), indices, scale,
                     group);
}

std::tuple<at::Tensor, at::Tensor> sparse_attn_latent_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t group) {
  return latent_backward_by_parts("hyscale::sparse_attn_latent_backward", kv, dim_v,
                                  [&](const at::Tensor& key, const at::Tensor& value) {
                                    return sparse_attn_backward(grad_out, q, key, value, indices,
                                                                scale, out, lse, group);
                                  });
}

at::Tensor selected_attention_mass(const at::Tensor& q, const at::Tensor& key,
                                   const at::Tensor& indices, const at::Tensor& lse, double scale) {
  const char* op = "hyscale::selected_attention_mass";
  // value only shapes the output of attention; the mass needs q, key and lse, so key stands in.
  const SparseAttnArgs a = check_sparse_attn(op, q, key, key, indices);
  check_index_range(op, indices, a.shape.num_keys);
  const auto& s = a.shape;
  const auto dtype = cpu_compute_dtype(q);
  const SeqView vq(q, a.batching, dtype), vk(key, a.batching, dtype);
  const SeqView vi(indices, a.batching, at::kInt), vl(lse, a.batching, dtype);
  check_sizes(op, "lse", vl.tensor(),
              batched_sizes({a.batching.batch, true}, {s.num_queries, s.heads}));
  const SeqView mass(
      at::empty(batched_sizes(a.batching, {s.num_queries, s.topk}), q.options().dtype(dtype)),
      {a.batching.batch, true}, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "selected_attention_mass", [&] {
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      selected_attention_mass_cpu<scalar_t>(
          s, vq.at<scalar_t>(b), vk.at<scalar_t>(b), vi.at<int32_t>(b), vl.at<scalar_t>(b),
          static_cast<scalar_t>(scale), mass.at<scalar_t>(b), cpu_context());
    }
  });
  return unbatch(mass.tensor(), a.batching);
}

// The reference: the two ops one after the other (the CPU backward keeps its probabilities in
// another order, so the target is computed again).
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attn_latent_backward_target(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t group) {
  auto [grad_q, grad_kv] =
      sparse_attn_latent_backward(grad_out, q, kv, indices, scale, dim_v, out, lse, group);
  return {grad_q, grad_kv, selected_attention_mass(q, kv, indices, lse, scale)};
}

at::Tensor indexer_kl(const at::Tensor& score, const at::Tensor& target) {
  const char* op = "hyscale::indexer_kl";
  check_kl_args(op, score, target);
  const auto dtype = cpu_compute_dtype(score);
  const int64_t topk = score.size(-1), rows = score.numel() / topk;
  const at::Tensor s = score.to(dtype).contiguous(), t = target.to(dtype).contiguous();
  at::Tensor loss = at::empty({rows}, score.options().dtype(dtype));
  AT_DISPATCH_FLOATING_TYPES(dtype, "indexer_kl", [&] {
    indexer_kl_fwd_cpu<scalar_t>(rows, topk, s.data_ptr<scalar_t>(), t.data_ptr<scalar_t>(),
                                 nullptr, loss.data_ptr<scalar_t>(), cpu_context());
  });
  return loss.view(score.sizes().slice(0, score.dim() - 1));
}

at::Tensor indexer_kl_backward(const at::Tensor& grad_loss, const at::Tensor& score,
                               const at::Tensor& target) {
  const char* op = "hyscale::indexer_kl_backward";
  check_kl_args(op, score, target);
  check_sizes(op, "grad_loss", grad_loss, score.sizes().slice(0, score.dim() - 1));
  const auto dtype = cpu_compute_dtype(score);
  const int64_t topk = score.size(-1), rows = score.numel() / topk;
  const at::Tensor s = score.to(dtype).contiguous(), t = target.to(dtype).contiguous();
  const at::Tensor g = grad_loss.to(dtype).contiguous();
  at::Tensor grad_score = at::empty_like(s);
  AT_DISPATCH_FLOATING_TYPES(dtype, "indexer_kl_backward", [&] {
    indexer_kl_bwd_cpu<scalar_t>(rows, topk, s.data_ptr<scalar_t>(), t.data_ptr<scalar_t>(),
                                 nullptr, g.data_ptr<scalar_t>(), grad_score.data_ptr<scalar_t>(),
                                 cpu_context());
  });
  return grad_score.to(score.scalar_type());
}

// The index scores at the slots again, the KL and its gradient under the given normalizer, then
// the scores' backward, per sequence; the [N, topk] scores and their gradient stay inside.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> indexer_loss_backward(
    const at::Tensor& target, const at::Tensor& score_lse, const at::Tensor& grad_loss,
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, const at::Tensor& indices) {
  const IndexerBackwardArgs args = check_indexer_loss_backward(
      "hyscale::indexer_loss_backward", target, score_lse, grad_loss, q, k, w, indices);
  const IndexerArgs& a = args.indexer;
  check_index_range("hyscale::indexer_loss_backward", indices, a.shape.num_keys);
  const int64_t n = a.shape.num_queries, topk = args.topk;
  const auto dtype = cpu_compute_dtype(q);
  const Batching& b = a.batching;
  const SeqView vq(q, b, dtype), vk(k, b, dtype), vw(w, b, dtype), vi(indices, b, at::kInt);
  const SeqView vt(target, b, dtype), vlse(score_lse, b, dtype), vg(grad_loss, b, dtype);
  const SeqView loss(at::empty(batched_sizes(b, {n}), q.options().dtype(dtype)), {b.batch, true},
                     dtype);
  const SeqView gq(at::empty_like(vq.tensor()), {b.batch, true}, dtype);
  const SeqView gk(at::empty_like(vk.tensor()), {b.batch, true}, dtype);
  const SeqView gw(at::empty_like(vw.tensor()), {b.batch, true}, dtype);
  at::Tensor scores = at::empty({n, topk}, q.options().dtype(dtype));
  at::Tensor grad_scores = at::empty_like(scores);
  AT_DISPATCH_FLOATING_TYPES(dtype, "indexer_loss_backward", [&] {
    auto* s = scores.data_ptr<scalar_t>();
    auto* gs = grad_scores.data_ptr<scalar_t>();
    for (int64_t i = 0; i < b.batch; ++i) {
      index_score_gather_cpu<scalar_t>(a.shape, vq.at<scalar_t>(i), vk.at<scalar_t>(i),
                                       vw.at<scalar_t>(i), vi.at<int32_t>(i), topk, s,
                                       cpu_context());
      indexer_kl_fwd_cpu<scalar_t>(n, topk, s, vt.at<scalar_t>(i), vlse.at<scalar_t>(i),
                                   loss.at<scalar_t>(i), cpu_context());
      indexer_kl_bwd_cpu<scalar_t>(n, topk, s, vt.at<scalar_t>(i), vlse.at<scalar_t>(i),
                                   vg.at<scalar_t>(i), gs, cpu_context());
      index_score_backward_cpu<scalar_t>(
          a.shape, vq.at<scalar_t>(i), vk.at<scalar_t>(i), vw.at<scalar_t>(i), vi.at<int32_t>(i),
          topk, gs, gq.at<scalar_t>(i), gk.at<scalar_t>(i), gw.at<scalar_t>(i), cpu_context());
    }
  });
  return {unbatch(loss.tensor(), b).to(target.scalar_type()),
          unbatch(gq.tensor(), b).to(q.scalar_type()), unbatch(gk.tensor(), b).to(k.scalar_type()),
          unbatch(gw.tensor(), b).to(w.scalar_type())};
}

// The kernels' three steps per sequence (the attention's log-sum-exps only when not given); the
// log-sum-exps stay inside ([B, N, H] and [B, N]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dense_indexer_kl(
    const at::Tensor& q, const at::Tensor& key, const at::Tensor& q_I, const at::Tensor& k_I,
    const at::Tensor& w, double scale, int64_t q_offset, int64_t tokens_per_key,
    const c10::optional<at::Tensor>& known_lse) {
  const DenseIndexerArgs a = check_dense_indexer_kl("hyscale::dense_indexer_kl", q, key, q_I, k_I,
                                                    w, q_offset, tokens_per_key, known_lse);
  const DenseIndexerShape& s = a.shape;
  const int64_t n = s.indexer.num_queries;
  const auto dtype = cpu_compute_dtype(q);
  const SeqView vq(q, a.batching, dtype), vkey(key, a.batching, dtype);
  const SeqView viq(q_I, a.batching, dtype), vik(k_I, a.batching, dtype), viw(w, a.batching, dtype);
  const Batching batched{a.batching.batch, true};
  const auto options = q.options().dtype(dtype);
  const SeqView lse =
      known_lse
          ? SeqView(*known_lse, a.batching, dtype)
          : SeqView(at::empty(batched_sizes(a.batching, {n, s.heads}), options), batched, dtype);
  const SeqView index_lse(at::empty(batched_sizes(a.batching, {n}), options), batched, dtype);
  const SeqView loss(at::empty(batched_sizes(a.batching, {n}), options), batched, dtype);
  const SeqView gq(at::empty_like(viq.tensor()), batched, dtype);
  const SeqView gk(at::empty_like(vik.tensor()), batched, dtype);
  const SeqView gw(at::empty_like(viw.tensor()), batched, dtype);
  AT_DISPATCH_FLOATING_TYPES(dtype, "dense_indexer_kl", [&] {
    const auto scale_t = static_cast<scalar_t>(scale);
    for (int64_t b = 0; b < a.batching.batch; ++b) {
      if (!known_lse) {
        dense_attention_lse_cpu<scalar_t>(s, vq.at<scalar_t>(b), vkey.at<scalar_t>(b), scale_t,
                                          lse.at<scalar_t>(b), cpu_context());
      }
      dense_index_lse_cpu<scalar_t>(s.indexer, viq.at<scalar_t>(b), vik.at<scalar_t>(b),
                                    viw.at<scalar_t>(b), index_lse.at<scalar_t>(b), cpu_context());
      dense_indexer_kl_cpu<scalar_t>(s, vq.at<scalar_t>(b), vkey.at<scalar_t>(b), scale_t,
                                     lse.at<scalar_t>(b), viq.at<scalar_t>(b), vik.at<scalar_t>(b),
                                     viw.at<scalar_t>(b), index_lse.at<scalar_t>(b),
                                     loss.at<scalar_t>(b), gq.at<scalar_t>(b), gk.at<scalar_t>(b),
                                     gw.at<scalar_t>(b), cpu_context());
    }
  });
  return {unbatch(loss.tensor(), a.batching),
          unbatch(gq.tensor(), a.batching).to(q_I.scalar_type()),
          unbatch(gk.tensor(), a.batching).to(k_I.scalar_type()),
          unbatch(gw.tensor(), a.batching).to(w.scalar_type())};
}

}  // namespace
}  // namespace hyscale::torch_ops

TORCH_LIBRARY_IMPL(hyscale, CPU, m) {
  using namespace hyscale::torch_ops;
  m.impl("flash_topk", &flash_topk);
  m.impl("quantize_e4m3", &quantize_e4m3);
  m.impl("index_score_gather", &index_score_gather);
  m.impl("index_score_backward", &index_score_backward);
  m.impl("sparse_attn", &sparse_attn);
  m.impl("sparse_attn_backward", &sparse_attn_backward);
  m.impl("sparse_attn_latent", &sparse_attn_latent);
  m.impl("sparse_attn_latent_backward", &sparse_attn_latent_backward);
  m.impl("selected_attention_mass", &selected_attention_mass);
  m.impl("sparse_attn_latent_backward_target", &sparse_attn_latent_backward_target);
  m.impl("indexer_kl", &indexer_kl);
  m.impl("indexer_kl_backward", &indexer_kl_backward);
  m.impl("indexer_loss_backward", &indexer_loss_backward);
  m.impl("dense_indexer_kl", &dense_indexer_kl);
  m.impl("dense_indexer_kl_row_multiple", [](const at::Tensor&) -> int64_t { return 1; });
}
