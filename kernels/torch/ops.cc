#include "kernels/torch/ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

namespace hyscale::ops {
namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace

Selection flash_topk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, int64_t topk,
                     int64_t q_offset, int64_t tokens_per_key, bool fp8) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, bool)>(
      "hyscale::flash_topk");
  auto [indices, scores] = handle.call(q, k, w, topk, q_offset, tokens_per_key, fp8);
  return {indices, scores};
}

Fp8Rows quantize_e4m3(const at::Tensor& x) {
  static const auto handle =
      op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&)>("hyscale::quantize_e4m3");
  auto [values, scales] = handle.call(x);
  return {values, scales};
}

at::Tensor index_score_gather(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                              const at::Tensor& indices, int64_t q_offset, int64_t tokens_per_key) {
  static const auto handle =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    int64_t, int64_t)>("hyscale::index_score_gather");
  return handle.call(q, k, w, indices, q_offset, tokens_per_key);
}

Attention sparse_attn(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                      const at::Tensor& indices, double scale, int64_t group) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, int64_t)>(
      "hyscale::sparse_attn");
  auto [out, lse] = handle.call(q, key, value, indices, scale, group);
  return {out, lse};
}

Attention sparse_attn_latent(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
                             double scale, int64_t dim_v, int64_t group) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, double, int64_t, int64_t)>(
      "hyscale::sparse_attn_latent");
  auto [out, lse] = handle.call(q, kv, indices, scale, dim_v, group);
  return {out, lse};
}

at::Tensor selected_attention_mass(const at::Tensor& q, const at::Tensor& key,
                                   const at::Tensor& indices, const at::Tensor& lse, double scale) {
  static const auto handle =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    double)>("hyscale::selected_attention_mass");
  return handle.call(q, key, indices, lse, scale);
}

at::Tensor indexer_kl(const at::Tensor& score, const at::Tensor& target) {
  static const auto handle =
      op<at::Tensor(const at::Tensor&, const at::Tensor&)>("hyscale::indexer_kl");
  return handle.call(score, target);
}

DenseIndexerLoss dense_indexer_kl(const at::Tensor& q, const at::Tensor& key, const at::Tensor& q_I,
                                  const at::Tensor& k_I, const at::Tensor& w, double scale,
                                  int64_t q_offset, int64_t tokens_per_key, const at::Tensor& lse) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      double, int64_t, int64_t, const c10::optional<at::Tensor>&)>("hyscale::dense_indexer_kl");
  const c10::optional<at::Tensor> known =
      lse.defined() ? c10::optional<at::Tensor>(lse) : c10::nullopt;
  auto [loss, gq, gk, gw] =
      handle.call(q, key, q_I, k_I, w, scale, q_offset, tokens_per_key, known);
  return {loss, gq, gk, gw};
}

int64_t dense_indexer_kl_row_multiple(const at::Tensor& q_I) {
  static const auto handle =
      op<int64_t(const at::Tensor&)>("hyscale::dense_indexer_kl_row_multiple");
  return handle.call(q_I);
}

IndexScoreGrads index_score_backward(const at::Tensor& grad_scores, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& w,
                                     const at::Tensor& indices, int64_t q_offset,
                                     int64_t tokens_per_key) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      int64_t, int64_t)>("hyscale::index_score_backward");
  auto [gq, gk, gw] = handle.call(grad_scores, q, k, w, indices, q_offset, tokens_per_key);
  return {gq, gk, gw};
}

AttentionGrads sparse_attn_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                    const at::Tensor& key, const at::Tensor& value,
                                    const at::Tensor& indices, double scale, const at::Tensor& out,
                                    const at::Tensor& lse, int64_t group) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      double, const at::Tensor&, const at::Tensor&, int64_t)>("hyscale::sparse_attn_backward");
  auto [gq, gk, gv] = handle.call(grad_out, q, key, value, indices, scale, out, lse, group);
  return {gq, gk, gv};
}

LatentAttentionGrads sparse_attn_latent_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                 const at::Tensor& kv, const at::Tensor& indices,
                                                 double scale, int64_t dim_v, const at::Tensor& out,
                                                 const at::Tensor& lse, int64_t group) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, int64_t,
      const at::Tensor&, const at::Tensor&, int64_t)>("hyscale::sparse_attn_latent_backward");
  auto [grad_q, grad_kv] = handle.call(grad_out, q, kv, indices, scale, dim_v, out, lse, group);
  return {grad_q, grad_kv};
}

LatentAttentionGradsAndTarget sparse_attn_latent_backward_target(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& kv,
    const at::Tensor& indices, double scale, int64_t dim_v, const at::Tensor& out,
    const at::Tensor& lse, int64_t group) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, int64_t,
      const at::Tensor&, const at::Tensor&, int64_t)>(
      "hyscale::sparse_attn_latent_backward_target");
  auto [grad_q, grad_kv, target] =
      handle.call(grad_out, q, kv, indices, scale, dim_v, out, lse, group);
  return {grad_q, grad_kv, target};
}

IndexerLossGrads indexer_loss_backward(const at::Tensor& target, const at::Tensor& score_lse,
                                       const at::Tensor& grad_loss, const at::Tensor& q,
                                       const at::Tensor& k, const at::Tensor& w,
                                       const at::Tensor& indices) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&, const at::Tensor&)>("hyscale::indexer_loss_backward");
  auto [loss, gq, gk, gw] = handle.call(target, score_lse, grad_loss, q, k, w, indices);
  return {loss, gq, gk, gw};
}

IndexerLossSlots indexer_loss(const at::Tensor& q_I, const at::Tensor& k_I, const at::Tensor& w,
                              const at::Tensor& indices, const at::Tensor& score_lse,
                              const at::Tensor& loss_rows) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&)>("hyscale::indexer_loss");
  auto [target, loss] = handle.call(q_I, k_I, w, indices, score_lse, loss_rows);
  return {target, loss};
}

AttentionAndIndexerLoss sparse_attn_indexer_loss(const at::Tensor& q, const at::Tensor& key,
                                                 const at::Tensor& value, const at::Tensor& indices,
                                                 const IndexerLossSlots& slots, double scale,
                                                 int64_t dim_v, int64_t group) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&,
      const at::Tensor&, const at::Tensor&, double, int64_t, int64_t)>(
      "hyscale::sparse_attn_indexer_loss");
  const c10::optional<at::Tensor> values =
      value.defined() ? c10::optional<at::Tensor>(value) : c10::nullopt;
  auto [out, lse, loss] =
      handle.call(q, key, values, indices, slots.target, slots.loss, scale, dim_v, group);
  return {out, lse, loss};
}

at::Tensor indexer_kl_backward(const at::Tensor& grad_loss, const at::Tensor& score,
                               const at::Tensor& target) {
  static const auto handle =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "hyscale::indexer_kl_backward");
  return handle.call(grad_loss, score, target);
}

}  // namespace hyscale::ops
