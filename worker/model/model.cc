#include "worker/model/model.h"

#include <torch/nn/init.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernels/torch/ops.h"
#include "worker/model/recompute.h"

namespace hyscale::trainer {
namespace {

using torch::indexing::Slice;

constexpr double kInitStd = 0.02;

torch::nn::Linear linear(int64_t in, int64_t out, double std) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(false));
  torch::nn::init::normal_(l->weight, 0.0, std);
  return l;
}

// Entries of a [.., T, M] table a query may see: key s <= the query's global position.
torch::Tensor visible_keys(const torch::Tensor& positions, int64_t num_keys) {
  return torch::arange(num_keys, positions.options()).unsqueeze(0) <= positions.unsqueeze(1);
}

// Maximal runs of consecutive global positions among a layer's queries: the kernels place
// queries by one q_offset per call, so a non-contiguous shard is selected run by run.
struct QueryRun {
  int64_t begin = 0;   // first local row
  int64_t length = 0;  // rows
  int64_t offset = 0;  // global position of the first row
};

std::vector<QueryRun> query_runs(const torch::Tensor& positions) {
  const auto pos = positions.to(torch::kCPU).contiguous();
  const auto* p = pos.data_ptr<int64_t>();
  std::vector<QueryRun> runs;
  for (int64_t i = 0; i < pos.numel(); ++i) {
    if (runs.empty() || p[i] != runs.back().offset + runs.back().length) {
      runs.push_back({i, 0, p[i]});
    }
    ++runs.back().length;
  }
  return runs;
}

// The indexer's top-k of every query (or, given replay indices, their scores), run by run. `fp8`
// selects on fp8 scores; the scores returned (the indexer loss's) are then rescored at the
// selected keys in full precision, as replay rescores them, so that recomputation with replay,
// with re-selection and without recomputation train alike (unless `loss_scores` says no loss
// will use them).
ops::Selection select(const LightningIndexerImpl::Projections& index,
                      const std::vector<QueryRun>& runs, int64_t topk, bool fp8,
                      const torch::Tensor& replay_indices, bool loss_scores = true) {
  std::vector<torch::Tensor> indices, scores;
  for (const auto& run : runs) {
    const auto rows = [&run](const torch::Tensor& t) { return t.narrow(1, run.begin, run.length); };
    if (replay_indices.defined()) {
      scores.push_back(ops::index_score_gather(rows(index.q), index.k, rows(index.w),
                                               rows(replay_indices), run.offset));
    } else {
      auto selection =
          ops::flash_topk(rows(index.q), index.k, rows(index.w), topk, run.offset, 1, fp8);
      indices.push_back(selection.indices);
      scores.push_back(fp8 && loss_scores
                           ? ops::index_score_gather(rows(index.q), index.k, rows(index.w),
                                                     selection.indices, run.offset)
                           : selection.scores);
    }
  }
  const auto join = [](const std::vector<torch::Tensor>& parts) {
    return parts.size() == 1 ? parts[0] : torch::cat(parts, 1);
  };
  ops::Selection selection;
  selection.indices = replay_indices.defined() ? replay_indices : join(indices);
  selection.scores = join(scores);
  return selection;
}

// KL(p || softmax(scores)) per row, over the entries `visible` allows; p is 0 elsewhere.
torch::Tensor dense_kl(const torch::Tensor& p, const torch::Tensor& scores,
                       const torch::Tensor& visible) {
  const auto log_q = torch::log_softmax(scores, -1).masked_fill(visible.logical_not(), 0.0);
  return (torch::xlogy(p, p) - p * log_q).sum(-1);
}

}  // namespace

ModelConfig ModelConfig::FromSpec(const v1::ModelSpec& spec) {
  ModelConfig c;
  c.vocab_size = spec.vocab_size();
  c.d_model = spec.d_model();
  c.layers = spec.layers();
  c.heads = spec.heads();
  c.head_dim_qk = spec.head_dim_qk();
  c.rope_dim = spec.rope_dim();
  c.head_dim_v = spec.head_dim_v();
  c.d_ff = spec.d_ff();
  c.rope_theta = spec.rope_theta();
  c.norm_eps = spec.norm_eps();
  c.index_heads = spec.indexer().heads();
  c.index_dim = spec.indexer().dim();
  c.index_rope_dim = spec.indexer().rope_dim();
  c.topk = spec.indexer().topk();
  c.index_fp8 = spec.indexer().fp8_scores();
  c.latent_kv = spec.latent_kv();
  return c;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight_;
}

torch::Tensor Rope::apply(const torch::Tensor& x, const torch::Tensor& positions) const {
  if (rope_dim_ == 0) return x;
  const int64_t t = x.size(1), half = rope_dim_ / 2;
  const auto options = x.options();
  const auto inv_freq =
      torch::pow(theta_, -torch::arange(0, half, options) * (2.0 / static_cast<double>(rope_dim_)));
  auto angles = torch::outer(positions.to(options.dtype()), inv_freq);  // [T, half]
  // Broadcast over the dims between T and the feature dim (heads, if any).
  std::vector<int64_t> shape{1, t};
  for (int64_t d = 2; d < x.dim() - 1; ++d) shape.push_back(1);
  shape.push_back(half);
  const auto cos = angles.cos().view(shape), sin = angles.sin().view(shape);
  const auto x1 = x.index({"...", Slice(first_, first_ + half)});
  const auto x2 = x.index({"...", Slice(first_ + half, first_ + rope_dim_)});
  return torch::cat({x.index({"...", Slice(0, first_)}), x1 * cos - x2 * sin, x2 * cos + x1 * sin,
                     x.index({"...", Slice(first_ + rope_dim_)})},
                    -1);
}

LightningIndexerImpl::LightningIndexerImpl(const ModelConfig& c)
    : rope_(c.index_rope_dim, c.rope_theta),
      weight_scale_(1.0 / std::sqrt(static_cast<double>(c.index_heads * c.index_dim))) {
  wq_ = register_module("wq", linear(c.d_model, c.index_heads * c.index_dim, kInitStd));
  wk_ = register_module("wk", linear(c.d_model, c.index_dim, kInitStd));
  ww_ = register_module("ww", linear(c.d_model, c.index_heads, kInitStd));
  k_norm_ =
      register_module("k_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.index_dim})));
}

torch::Tensor LightningIndexerImpl::project_keys(const torch::Tensor& h,
                                                 const torch::Tensor& positions) {
  return rope_.apply(k_norm_->forward(wk_->forward(h)), positions);
}

void LightningIndexerImpl::project_queries(const torch::Tensor& h, const torch::Tensor& positions,
                                           Projections& p) {
  const int64_t b = h.size(0), t = h.size(1);
  const int64_t heads = ww_->options.out_features();
  p.q = rope_.apply(wq_->forward(h).view({b, t, heads, -1}), positions);
  p.w = ww_->forward(h) * weight_scale_;
}

torch::Tensor LightningIndexerImpl::dense_scores(const Projections& p,
                                                 const torch::Tensor& visible) {
  // [B, T, H_I, S]: each query head against every key, then the weighted ReLU sum over heads.
  const auto per_head = torch::relu(torch::einsum("bthd,bsd->bths", {p.q, p.k}));
  const auto scores = (per_head * p.w.unsqueeze(-1)).sum(2);
  return scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
}

DsaLayerImpl::DsaLayerImpl(const ModelConfig& c)
    : config_(c),
      // With a latent, RoPE takes the last features: the first ones are also the values.
      rope_(c.rope_dim, c.rope_theta, c.latent_kv ? c.head_dim_qk - c.rope_dim : 0),
      scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim_qk))) {
  // Residual-branch outputs start smaller so the residual stream does not grow with depth.
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.layers));
  attn_norm_ = register_module("attn_norm", RMSNorm(c.d_model, c.norm_eps));
  wq_ = register_module("wq", linear(c.d_model, c.heads * c.head_dim_qk, kInitStd));
  wk_ = register_module("wk", linear(c.d_model, c.head_dim_qk, kInitStd));
  if (!c.latent_kv) wv_ = register_module("wv", linear(c.d_model, c.head_dim_v, kInitStd));
  wo_ = register_module("wo", linear(c.heads * c.head_dim_v, c.d_model, out_std));
  indexer_ = register_module("indexer", LightningIndexer(c));
  mlp_norm_ = register_module("mlp_norm", RMSNorm(c.d_model, c.norm_eps));
  w_gate_ = register_module("w_gate", linear(c.d_model, c.d_ff, kInitStd));
  w_up_ = register_module("w_up", linear(c.d_model, c.d_ff, kInitStd));
  w_down_ = register_module("w_down", linear(c.d_ff, c.d_model, out_std));
}

DsaLayerImpl::Attention DsaLayerImpl::dense_attention(
    const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value,
    const LightningIndexerImpl::Projections& index, const torch::Tensor& positions,
    const ForwardOptions& options) {
  Attention a;
  const auto visible = visible_keys(positions, key.size(1));
  torch::Tensor probs;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTENTION);
    const auto logits = torch::einsum("bthd,bsd->bhts", {q, key}) * scale_;
    probs = torch::softmax(
        logits.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity()), -1);
    a.out = torch::einsum("bhts,bsv->bthv", {probs, value});
  }
  if (options.indexer_loss) {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_INDEXER_LOSS);
    // Target: attention probabilities summed over heads, L1-normalised (each head sums to 1).
    const auto target = probs.detach().sum(1) / static_cast<double>(config_.heads);
    a.loss = dense_kl(target, LightningIndexerImpl::dense_scores(index, visible), visible).mean();
  }
  return a;
}

DsaLayerImpl::Attention DsaLayerImpl::sparse_attention(
    const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value,
    const LightningIndexerImpl::Projections& index, const torch::Tensor& positions,
    const ForwardOptions& options, const torch::Tensor& replay_indices, SelectionStats& stats) {
  Attention a;
  torch::Tensor scores;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_SELECTION);
    if (replay_indices.defined()) {
      ++stats.replays;
    } else {
      ++(options.clock->recomputing() ? stats.recompute_selections : stats.selections);
    }
    auto selection = select(index, query_runs(positions), config_.topk, config_.index_fp8,
                            replay_indices, options.indexer_loss);
    a.indices = selection.indices;
    scores = selection.scores;
  }
  torch::Tensor lse;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTENTION);
    // A latent's values are its keys' first features: one tensor, one gradient.
    auto attn = config_.latent_kv
                    ? ops::sparse_attn_latent(q, key, a.indices, scale_, config_.head_dim_v,
                                              options.query_group)
                    : ops::sparse_attn(q, key, value, a.indices, scale_, options.query_group);
    a.out = attn.out;
    lse = attn.lse;
  }
  if (options.indexer_loss) {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_INDEXER_LOSS);
    const auto target = ops::selected_attention_mass(q, key, a.indices, lse, scale_);
    a.loss = ops::indexer_kl(scores, target).mean();
  }
  return a;
}

torch::Tensor DsaLayerImpl::mlp(const torch::Tensor& x, const ForwardOptions& options) {
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_MLP);
  const auto h = mlp_norm_(x);
  return x + w_down_(torch::silu(w_gate_(h)) * w_up_(h));
}

LayerOutput DsaLayerImpl::forward(const torch::Tensor& x, const ForwardOptions& options,
                                  const torch::Tensor& replay_indices, SelectionStats& stats) {
  auto& clock = *options.clock;
  const int64_t b = x.size(0), t = x.size(1);
  const auto& exchange = options.key_exchange;
  const auto positions = exchange ? exchange->positions().to(x.device())
                                  : torch::arange(t, x.options().dtype(torch::kLong));
  torch::Tensor h, key, value;
  LightningIndexerImpl::Projections index;
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_ATTN_PROJ);
    h = attn_norm_(x);
    key = rope_.apply(wk_(h), positions);
    if (!config_.latent_kv) value = wv_(h);
  }
  {
    // The indexer's inputs are detached: it learns only from its KL loss.
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_SELECTION);
    index.k = indexer_->project_keys(h.detach(), positions);
  }
  // Under context parallelism the key side travels while the query side is projected; the
  // indexer keys either with the attention keys or on their own group, concurrently.
  const auto& indexer_exchange = options.indexer_key_exchange;
  if (indexer_exchange || exchange) {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_COMM);
    if (indexer_exchange) indexer_exchange->start(index.k);
    if (exchange) {
      // The key side: the keys, the values unless they are the keys' first features, and the
      // indexer keys unless they travel on their own.
      std::vector<torch::Tensor> side{key};
      if (!config_.latent_kv) side.push_back(value);
      if (!indexer_exchange) side.push_back(index.k);
      exchange->start(torch::cat(side, -1));
    }
  }
  torch::Tensor q;
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_ATTN_PROJ);
    q = rope_.apply(wq_(h).view({b, t, config_.heads, config_.head_dim_qk}), positions);
  }
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_SELECTION);
    indexer_->project_queries(h.detach(), positions, index);
  }
  if (exchange) {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_COMM);
    const torch::Tensor gathered = exchange->finish();
    std::vector<int64_t> widths{config_.head_dim_qk};
    if (!config_.latent_kv) widths.push_back(config_.head_dim_v);
    if (!indexer_exchange) widths.push_back(index.k.size(-1));
    const auto parts = gathered.split_with_sizes(widths, -1);
    // A latent's keys are made contiguous so that the values stay a view of them (the
    // attention kernels then gather each row once).
    key = config_.latent_kv ? parts[0].contiguous() : parts[0];
    if (!config_.latent_kv) value = parts[1];
    if (!indexer_exchange) index.k = parts.back();
  }
  if (config_.latent_kv) value = key.narrow(-1, 0, config_.head_dim_v);
  if (indexer_exchange) {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_COMM);
    index.k = indexer_exchange->finish();
  }
  Attention a =
      options.attention == AttentionMode::kDense
          ? dense_attention(q, key, value, index, positions, options)
          : sparse_attention(q, key, value, index, positions, options, replay_indices, stats);
  LayerOutput out;
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_ATTN_PROJ);
    out.x = x + wo_(a.out.reshape({b, t, config_.heads * config_.head_dim_v}));
  }
  out.x = mlp(out.x, options);
  out.indexer_loss = a.loss;
  out.indices = a.indices;
  if (options.keep_probes) {
    out.probe.q = q.detach();
    out.probe.key = key.detach();
    const LightningIndexerImpl::Projections detached{index.q.detach(), index.k.detach(),
                                                     index.w.detach()};
    out.probe.indices = a.indices.defined() ? a.indices
                                            : select(detached, query_runs(positions), config_.topk,
                                                     config_.index_fp8, torch::Tensor())
                                                  .indices;
  }
  return out;
}

DsaModelImpl::DsaModelImpl(const ModelConfig& c) : config_(c) {
  embedding_ = register_module("embedding", torch::nn::Embedding(c.vocab_size, c.d_model));
  torch::nn::init::normal_(embedding_->weight, 0.0, kInitStd);
  auto layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    layers_.emplace_back(c);
    layers->push_back(layers_.back());
  }
  final_norm_ = register_module("final_norm", RMSNorm(c.d_model, c.norm_eps));
  lm_head_ = register_module("lm_head", linear(c.d_model, c.vocab_size, kInitStd));
}

ForwardResult DsaModelImpl::forward(const torch::Tensor& tokens, const ForwardOptions& options) {
  ForwardResult result;
  auto& clock = *options.clock;
  torch::Tensor x;
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_LM_HEAD);
    x = embedding_(tokens);
  }
  std::vector<torch::Tensor> losses;
  result.indexer_loss_value = torch::zeros({}, x.options());
  const double per_layer = 1.0 / static_cast<double>(layers_.size());
  const bool recompute = options.recompute && torch::GradMode::is_enabled();
  for (auto& layer : layers_) {
    LayerOutput out = recompute ? checkpointed_layer(layer, x, options, stats_,
                                                     result.indexer_loss_value, per_layer)
                                : layer->forward(x, options, torch::Tensor(), stats_);
    x = out.x;
    if (out.indexer_loss.defined()) losses.push_back(out.indexer_loss);
    if (out.indexer_loss.defined() && !recompute) {
      torch::NoGradGuard no_grad;
      result.indexer_loss_value.add_(out.indexer_loss.detach().to(x.scalar_type()) * per_layer);
    }
    if (options.keep_probes) result.probes.push_back(out.probe);
  }
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_LM_HEAD);
    result.logits = lm_head_(final_norm_(x));
  }
  PhaseClock::Scope scope(clock, v1::STEP_PHASE_INDEXER_LOSS);
  result.indexer_loss =
      losses.empty() ? torch::zeros({}, x.options()) : torch::stack(losses).mean();
  return result;
}

std::vector<torch::Tensor> DsaModelImpl::indexer_parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& layer : layers_) {
    for (const auto& p : layer->indexer_parameters()) params.push_back(p);
  }
  return params;
}

}  // namespace hyscale::trainer
