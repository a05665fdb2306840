// Autograd of every hyscale op, in one place. Forward runs the backend below autograd; backward
// calls the matching backward op, so each device backend only implements forward/backward pairs.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <tuple>

#include "kernels/torch/ops.h"

namespace hyscale::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

at::Tensor zeros_if_undefined(const at::Tensor& grad, const at::Tensor& like) {
  return grad.defined() ? grad : at::zeros_like(like);
}

// Scores at selected keys (from flash_topk or index_score_gather) share one backward.
variable_list index_score_grads(AutogradContext* ctx, const at::Tensor& grad_scores) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &q = saved[0], &k = saved[1], &w = saved[2], &indices = saved[3];
  if (!grad_scores.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
  const auto g =
      ops::index_score_backward(grad_scores, q, k, w, indices, ctx->saved_data["q_offset"].toInt(),
                                ctx->saved_data["tokens_per_key"].toInt());
  return {g.q, g.k, g.w};
}

void save_index_score_inputs(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& w, const at::Tensor& indices, int64_t q_offset,
                             int64_t tokens_per_key) {
  ctx->save_for_backward({q, k, w, indices});
  ctx->saved_data["q_offset"] = q_offset;
  ctx->saved_data["tokens_per_key"] = tokens_per_key;
}

// Saves `inputs`, then the attention's out and lse, with the scale and the query group of its
// backward; returns out and lse, lse not differentiable.
variable_list save_attention(AutogradContext* ctx, variable_list inputs, const ops::Attention& attn,
                             double scale, int64_t group) {
  inputs.push_back(attn.out);
  inputs.push_back(attn.lse);
  ctx->save_for_backward(inputs);
  ctx->saved_data["scale"] = scale;
  ctx->saved_data["group"] = group;
  ctx->mark_non_differentiable({attn.lse});
  return {attn.out, attn.lse};
}

struct FlashTopk : torch::autograd::Function<FlashTopk> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& w, int64_t topk, int64_t q_offset,
                               int64_t tokens_per_key, bool fp8) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto sel = ops::flash_topk(q, k, w, topk, q_offset, tokens_per_key, fp8);
    save_index_score_inputs(ctx, q, k, w, sel.indices, q_offset, tokens_per_key);
    ctx->mark_non_differentiable({sel.indices});
    return {sel.indices, sel.scores};
  }
  // With fp8 scoring, the bf16 scores' gradient (straight-through).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = index_score_grads(ctx, grads[1]);
    return {g[0], g[1], g[2], Variable(), Variable(), Variable(), Variable()};
  }
};

struct IndexScoreGather : torch::autograd::Function<IndexScoreGather> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& w, const at::Tensor& indices, int64_t q_offset,
                               int64_t tokens_per_key) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_index_score_inputs(ctx, q, k, w, indices, q_offset, tokens_per_key);
    return {ops::index_score_gather(q, k, w, indices, q_offset, tokens_per_key)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = index_score_grads(ctx, grads[0]);
    return {g[0], g[1], g[2], Variable(), Variable(), Variable()};
  }
};

struct SparseAttn : torch::autograd::Function<SparseAttn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& indices, double scale,
                               int64_t group) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto attn = ops::sparse_attn(q, key, value, indices, scale, group);
    return save_attention(ctx, {q, key, value, indices}, attn, scale, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    if (!grads[0].defined()) return variable_list(6);
    const auto g = ops::sparse_attn_backward(grads[0], s[0], s[1], s[2], s[3],
                                             ctx->saved_data["scale"].toDouble(), s[4], s[5],
                                             ctx->saved_data["group"].toInt());
    return {g.q, g.key, g.value, Variable(), Variable(), Variable()};
  }
};

struct SparseAttnLatent : torch::autograd::Function<SparseAttnLatent> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& kv,
                               const at::Tensor& indices, double scale, int64_t dim_v,
                               int64_t group) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto attn = ops::sparse_attn_latent(q, kv, indices, scale, dim_v, group);
    ctx->saved_data["dim_v"] = dim_v;
    return save_attention(ctx, {q, kv, indices}, attn, scale, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    if (!grads[0].defined()) return variable_list(6);
    const auto g = ops::sparse_attn_latent_backward(
        grads[0], s[0], s[1], s[2], ctx->saved_data["scale"].toDouble(),
        ctx->saved_data["dim_v"].toInt(), s[3], s[4], ctx->saved_data["group"].toInt());
    return {g.q, g.kv, Variable(), Variable(), Variable(), Variable()};
  }
};

// The target is a constant of the loss (the model detaches it); only score gets a gradient.
struct IndexerKl : torch::autograd::Function<IndexerKl> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& score,
                               const at::Tensor& target) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({score, target});
    return {ops::indexer_kl(score, target)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    return {ops::indexer_kl_backward(zeros_if_undefined(grads[0], s[0].select(-1, 0)), s[0], s[1]),
            Variable()};
  }
};

// The indexer's KL loss on a selection whose target the attention's backward forms, as a node of
// its own: the forward returns two slots (zeros that take no memory) for the attention node
// (SparseAttnIndexerLoss) to consume. That node's backward returns the target as target_slot's
// gradient and the loss's per-row gradient as loss_slot's, so autograd runs this node's backward
// right after the attention's: it writes each row's KL into loss_rows and gives q_I, k_I and w
// their gradients (indexer_loss_backward: the scores are formed there, so none is kept from the
// forward). score_lse, the target and the loss are constants (the model detaches the target;
// score_lse is the selection's).
struct IndexerLoss : torch::autograd::Function<IndexerLoss> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_I, const at::Tensor& k_I,
                               const at::Tensor& w, const at::Tensor& indices,
                               const at::Tensor& score_lse, const at::Tensor& loss_rows) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const auto rows = indices.sizes().slice(0, indices.dim() - 1);
    TORCH_CHECK(loss_rows.sizes() == rows, "hyscale::indexer_loss: loss_rows must be ", rows,
                " (the indices' rows), got ", loss_rows.sizes());
    ctx->save_for_backward({q_I, k_I, w, indices, score_lse});
    ctx->saved_data["loss_rows"] = loss_rows;
    const auto zero = at::zeros({1}, loss_rows.options());
    return {zero.expand(indices.sizes()), zero.expand(rows)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto loss_rows = ctx->saved_data["loss_rows"].toTensor();
    TORCH_CHECK(grads[0].defined(), "hyscale::indexer_loss: no target reached the loss (its ",
                "slots must feed sparse_attn_indexer_loss)");
    const auto g = ops::indexer_loss_backward(
        grads[0], s[4], zeros_if_undefined(grads[1], loss_rows), s[0], s[1], s[2], s[3]);
    loss_rows.copy_(g.loss);
    return {g.q, g.k, g.w, Variable(), Variable(), Variable()};
  }
};

// Sparse attention and the handle of the indexer's loss on its selection (zeros [.., N]): the
// backward runs the attention backward, which also forms the target (the probabilities it
// recomputes summed over heads: sparse_attn_latent_backward_target; selected_attention_mass after
// the separate-values backward), and returns the target and the handle's gradient as the
// gradients of IndexerLoss's slots. `latent`: value is key itself (an input must be defined) and
// takes no gradient of its own.
struct SparseAttnIndexerLoss : torch::autograd::Function<SparseAttnIndexerLoss> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& indices,
                               const at::Tensor& target_slot, const at::Tensor& loss_slot,
                               double scale, bool latent, int64_t dim_v, int64_t group) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    TORCH_CHECK(target_slot.sizes() == indices.sizes() &&
                    loss_slot.sizes() == indices.sizes().slice(0, indices.dim() - 1),
                "hyscale::sparse_attn_indexer_loss: the slots must be indexer_loss's for these ",
                "indices ", indices.sizes(), ", got ", target_slot.sizes(), " and ",
                loss_slot.sizes());
    auto attn = latent ? ops::sparse_attn_latent(q, key, indices, scale, dim_v, group)
                       : ops::sparse_attn(q, key, value, indices, scale, group);
    ctx->saved_data["latent"] = latent;
    ctx->saved_data["dim_v"] = dim_v;
    auto outputs = save_attention(ctx, {q, key, value, indices}, attn, scale, group);
    outputs.push_back(at::zeros(loss_slot.sizes(), loss_slot.options()));  // the loss's handle
    return outputs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &key = s[1], &value = s[2], &indices = s[3], &out = s[4],
                     &lse = s[5];
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t group = ctx->saved_data["group"].toInt();
    const auto grad_out = zeros_if_undefined(grads[0], out);
    at::Tensor grad_q, grad_key, grad_value, target;
    if (!ctx->saved_data["latent"].toBool()) {
      auto g = ops::sparse_attn_backward(grad_out, q, key, value, indices, scale, out, lse, group);
      grad_q = g.q, grad_key = g.key, grad_value = g.value;
      target = ops::selected_attention_mass(q, key, indices, lse, scale);
    } else {
      auto g = ops::sparse_attn_latent_backward_target(
          grad_out, q, key, indices, scale, ctx->saved_data["dim_v"].toInt(), out, lse, group);
      grad_q = g.q, grad_key = g.kv, target = g.target;
    }
    return {grad_q,   grad_key,   grad_value, Variable(), target,
            grads[2], Variable(), Variable(), Variable(), Variable()};
  }
};

std::tuple<at::Tensor, at::Tensor> flash_topk(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& w, int64_t topk, int64_t q_offset,
                                              int64_t tokens_per_key, bool fp8) {
  auto r = FlashTopk::apply(q, k, w, topk, q_offset, tokens_per_key, fp8);
  return {r[0], r[1]};
}

at::Tensor index_score_gather(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w,
                              const at::Tensor& indices, int64_t q_offset, int64_t tokens_per_key) {
  return IndexScoreGather::apply(q, k, w, indices, q_offset, tokens_per_key)[0];
}

std::tuple<at::Tensor, at::Tensor> sparse_attn(const at::Tensor& q, const at::Tensor& key,
                                               const at::Tensor& value, const at::Tensor& indices,
                                               double scale, int64_t group) {
  auto r = SparseAttn::apply(q, key, value, indices, scale, group);
  return {r[0], r[1]};
}

std::tuple<at::Tensor, at::Tensor> sparse_attn_latent(const at::Tensor& q, const at::Tensor& kv,
                                                      const at::Tensor& indices, double scale,
                                                      int64_t dim_v, int64_t group) {
  auto r = SparseAttnLatent::apply(q, kv, indices, scale, dim_v, group);
  return {r[0], r[1]};
}

// A target, never differentiated: computed below autograd whatever its inputs require.
at::Tensor selected_attention_mass(const at::Tensor& q, const at::Tensor& key,
                                   const at::Tensor& indices, const at::Tensor& lse, double scale) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return ops::selected_attention_mass(q.detach(), key.detach(), indices, lse.detach(), scale);
}

at::Tensor indexer_kl(const at::Tensor& score, const at::Tensor& target) {
  return IndexerKl::apply(score, target)[0];
}

std::tuple<at::Tensor, at::Tensor> indexer_loss(const at::Tensor& q_I, const at::Tensor& k_I,
                                                const at::Tensor& w, const at::Tensor& indices,
                                                const at::Tensor& score_lse,
                                                const at::Tensor& loss_rows) {
  auto r = IndexerLoss::apply(q_I, k_I, w, indices, score_lse, loss_rows);
  return {r[0], r[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attn_indexer_loss(
    const at::Tensor& q, const at::Tensor& key, const c10::optional<at::Tensor>& value,
    const at::Tensor& indices, const at::Tensor& target_slot, const at::Tensor& loss_slot,
    double scale, int64_t dim_v, int64_t group) {
  auto r = SparseAttnIndexerLoss::apply(q, key, value.value_or(key), indices, target_slot,
                                        loss_slot, scale, !value.has_value(), dim_v, group);
  return {r[0], r[1], r[2]};
}

}  // namespace
}  // namespace hyscale::torch_ops

TORCH_LIBRARY_IMPL(hyscale, Autograd, m) {
  using namespace hyscale::torch_ops;
  m.impl("flash_topk", &flash_topk);
  m.impl("index_score_gather", &index_score_gather);
  m.impl("sparse_attn", &sparse_attn);
  m.impl("sparse_attn_latent", &sparse_attn_latent);
  m.impl("selected_attention_mass", &selected_attention_mass);
  m.impl("indexer_kl", &indexer_kl);
  m.impl("indexer_loss", &indexer_loss);
  m.impl("sparse_attn_indexer_loss", &sparse_attn_indexer_loss);
}
