#include "worker/model/model.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernels/torch/compat.h"
#include "kernels/torch/ops.h"
#include "worker/model/index_packing.h"
#include "worker/model/recompute.h"

namespace hyscale::trainer {
namespace {

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
// with re-selection and without recomputation train alike. Where `loss_scores` says no loss will
// use them, nothing is rescored (replay then returns no scores).
ops::Selection select(const LightningIndexerImpl::Projections& index,
                      const std::vector<QueryRun>& runs, int64_t topk, bool fp8,
                      const torch::Tensor& replay_indices, bool loss_scores = true) {
  std::vector<torch::Tensor> indices, scores;
  for (const auto& run : runs) {
    // A run of every row takes the tensor itself: a narrow's backward would write a zero tensor
    // of the indexer queries' size and copy their gradient into it.
    const auto rows = [&run](const torch::Tensor& t) {
      return run.begin == 0 && run.length == t.size(1) ? t : t.narrow(1, run.begin, run.length);
    };
    if (replay_indices.defined()) {
      if (loss_scores) {
        scores.push_back(ops::index_score_gather(rows(index.q), index.k, rows(index.w),
                                                 rows(replay_indices), run.offset));
      }
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
    if (parts.empty()) return torch::Tensor();
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

// A [B, T, ...] tensor assembled from chunks of its rows: in place when no graph is recorded (each
// chunk's part can be freed as the next one runs), by concatenation when one is. Undefined parts
// (a dense layer's indices) leave it undefined.
class RowAssembler {
 public:
  RowAssembler(int64_t rows, size_t chunks) : rows_(rows), chunks_(chunks) {}

  void add(int64_t begin, const torch::Tensor& part) {
    if (!part.defined()) return;
    if (chunks_ == 1) {
      whole_ = part;
    } else if (torch::GradMode::is_enabled()) {
      parts_.push_back(part);
    } else {
      if (!whole_.defined()) {
        auto sizes = part.sizes().vec();
        sizes[1] = rows_;
        whole_ = torch::empty(sizes, part.options());
      }
      whole_.narrow(1, begin, part.size(1)).copy_(part);
    }
  }
  torch::Tensor take() { return parts_.empty() ? whole_ : torch::cat(parts_, 1); }

 private:
  int64_t rows_;
  size_t chunks_;
  torch::Tensor whole_;
  std::vector<torch::Tensor> parts_;
};

// `t` (if defined) as a leaf of a graph of its own.
torch::Tensor as_leaf(const torch::Tensor& t) {
  return t.defined() ? t.detach().requires_grad_(true) : t;
}

// Zeros shaped as `t` (if defined) in fp32 at least: a gradient summed over many chunks in bf16
// would lose bits.
torch::Tensor gradient_accumulator(const torch::Tensor& t) {
  return t.defined()
             ? torch::zeros(t.sizes(),
                            t.options().dtype(at::promote_types(t.scalar_type(), torch::kFloat)))
             : t;
}

// Outputs and their gradients for one autograd backward call; a pair is skipped when either is
// missing or the output has no graph.
class Gradients {
 public:
  void add(const torch::Tensor& output, const torch::Tensor& grad) {
    if (output.defined() && output.requires_grad() && grad.defined()) {
      outputs_.push_back(output);
      grads_.push_back(grad);
    }
  }
  void run() {
    if (!outputs_.empty()) torch::autograd::backward(outputs_, grads_);
  }

 private:
  std::vector<torch::Tensor> outputs_, grads_;
};

// x with features [first, first + half) and [first + half, first + 2 half) turned by the angles
// whose cos and sin are given (rotate-half pairs), the rest copied: one pass over x, then the
// rotated features.
torch::Tensor rotate_half_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                                const torch::Tensor& sin, int64_t first) {
  const int64_t half = cos.size(-1);
  auto out = x.clone(at::MemoryFormat::Contiguous);
  const auto x1 = x.narrow(-1, first, half), x2 = x.narrow(-1, first + half, half);
  auto out1 = out.narrow(-1, first, half), out2 = out.narrow(-1, first + half, half);
  at::mul_out(out1, x1, cos).addcmul_(x2, sin, -1.0);
  at::mul_out(out2, x2, cos).addcmul_(x1, sin);
  return out;
}

// RoPE's autograd: the gradient turns back by the same angles (cos, -sin). Autograd of the
// slices and the cat would instead build a zero tensor of x's size for each of the four pieces
// and add them, which made the backward of the queries' RoPE 10x slower (2048x4's q on the CPU).
struct RopeRotation : torch::autograd::Function<RopeRotation> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin, int64_t first) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["first"] = first;
    return rotate_half_pairs(x, cos, sin, first);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotate_half_pairs(grads[0], saved[0], -saved[1], ctx->saved_data["first"].toInt()),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

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
  // The angles in fp32 at least, whatever x's dtype: in bf16 (x under autocast) positions past 256
  // would round (to multiples of 512 at 128K), and queries and keys of different dtypes would turn
  // by different angles. cos and sin then take x's dtype.
  const auto options =
      x.options().dtype(x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat);
  const auto inv_freq =
      torch::pow(theta_, -torch::arange(0, half, options) * (2.0 / static_cast<double>(rope_dim_)));
  const auto angles = positions.to(options.dtype()).unsqueeze(1) * inv_freq;  // [T, half]
  // Broadcast over the dims between T and the feature dim (heads, if any).
  std::vector<int64_t> shape{1, t};
  for (int64_t d = 2; d < x.dim() - 1; ++d) shape.push_back(1);
  shape.push_back(half);
  const auto cos = angles.cos().to(x.scalar_type()).view(shape);
  const auto sin = angles.sin().to(x.scalar_type()).view(shape);
  return RopeRotation::apply(x, cos, sin, first_);
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

// A run of a layer's query rows, processed together.
struct DsaLayerImpl::Chunk {
  int64_t begin = 0;           // first local row
  int64_t length = 0;          // rows
  torch::Tensor positions;     // [length] their global positions, on the layer's device
  std::vector<QueryRun> runs;  // maximal runs of consecutive positions among them
  int64_t keys = 0;            // keys any of them sees: its last position + 1
};

std::vector<DsaLayerImpl::Chunk> DsaLayerImpl::chunks(const torch::Tensor& x,
                                                      const ForwardOptions& options) const {
  const int64_t t = x.size(1);
  const auto& exchange = options.key_exchange;
  const auto positions =
      exchange ? exchange->positions().to(torch::kCPU) : torch::arange(t, torch::kLong);
  TORCH_CHECK(positions.numel() == t, "the key exchange's positions (", positions.numel(),
              ") do not match the layer input's rows (", t, ")");
  // Made on the device without a copy from the host where possible: a blocking copy would make
  // the host wait for the stream at every layer.
  const auto on_device =
      exchange ? positions.to(x.device()) : torch::arange(t, x.options().dtype(torch::kLong));
  const int64_t size = options.query_chunk > 0 ? std::min(options.query_chunk, t) : t;
  std::vector<Chunk> out;
  for (int64_t begin = 0; begin < t; begin += size) {
    Chunk c;
    c.begin = begin;
    c.length = std::min(size, t - begin);
    const auto mine = positions.narrow(0, begin, c.length);
    c.positions = on_device.narrow(0, begin, c.length);
    c.runs = query_runs(mine);
    c.keys = mine[c.length - 1].item<int64_t>() + 1;
    out.push_back(std::move(c));
  }
  return out;
}

torch::Tensor DsaLayerImpl::normed(const torch::Tensor& x, const ForwardOptions& options) {
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTN_PROJ);
  return attn_norm_(x);
}

DsaLayerImpl::KeySide DsaLayerImpl::key_side(const torch::Tensor& h, const torch::Tensor& positions,
                                             const ForwardOptions& options) {
  KeySide side;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTN_PROJ);
    side.key = rope_.apply(wk_(h), positions);
    if (!config_.latent_kv) side.value = wv_(h);
  }
  // The indexer's inputs are detached: it learns only from its KL loss.
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_SELECTION);
  side.index_k = indexer_->project_keys(h.detach(), positions);
  return side;
}

DsaLayerImpl::KeySide DsaLayerImpl::key_side(const torch::Tensor& x,
                                             const std::vector<Chunk>& chunks,
                                             const ForwardOptions& options, torch::Tensor* h) {
  if (chunks.size() == 1) {
    *h = normed(x, options);
    return key_side(*h, chunks[0].positions, options);
  }
  RowAssembler key(x.size(1), chunks.size()), value(key), index_k(key);
  for (const Chunk& c : chunks) {
    const KeySide part =
        key_side(normed(x.narrow(1, c.begin, c.length), options), c.positions, options);
    key.add(c.begin, part.key);
    value.add(c.begin, part.value);
    index_k.add(c.begin, part.index_k);
  }
  return {key.take(), value.take(), index_k.take()};
}

DsaLayerImpl::QuerySide DsaLayerImpl::query_side(const torch::Tensor& h,
                                                 const torch::Tensor& positions,
                                                 const ForwardOptions& options,
                                                 bool index_queries) {
  QuerySide side;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTN_PROJ);
    side.q = rope_.apply(wq_(h).view({h.size(0), h.size(1), config_.heads, config_.head_dim_qk}),
                         positions);
  }
  if (!index_queries) return side;
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_SELECTION);
  indexer_->project_queries(h.detach(), positions, side.index);
  return side;
}

// Replayed indices without the indexer loss (a recomputation of a step that does not train the
// indexer) read neither the indexer's queries nor its scores: projecting them would be a GEMM of
// d_model x H_I d_I a token and the scores' gather for nothing.
bool DsaLayerImpl::needs_index_queries(const ForwardOptions& options, const Replay& replay) const {
  const bool selects = options.attention == AttentionMode::kSparse && !replay.defined();
  return selects || options.indexer_loss || options.keep_probes;
}

void DsaLayerImpl::start_exchange(const KeySide& local, const ForwardOptions& options) {
  const auto& exchange = options.key_exchange;
  const auto& indexer_exchange = options.indexer_key_exchange;
  if (!exchange && !indexer_exchange) return;
  // The indexer keys travel either with the attention keys or on their own group, concurrently.
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_COMM);
  if (indexer_exchange) indexer_exchange->start(local.index_k);
  if (exchange) {
    std::vector<torch::Tensor> side{local.key};
    if (!config_.latent_kv) side.push_back(local.value);
    if (!indexer_exchange) side.push_back(local.index_k);
    exchange->start(torch::cat(side, -1));
  }
}

DsaLayerImpl::KeySide DsaLayerImpl::finish_exchange(const KeySide& local,
                                                    const ForwardOptions& options) {
  const auto& exchange = options.key_exchange;
  const auto& indexer_exchange = options.indexer_key_exchange;
  KeySide all = local;
  if (!exchange && !indexer_exchange) return all;
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_COMM);
  if (exchange) {
    const torch::Tensor gathered = exchange->finish();
    std::vector<int64_t> widths{config_.head_dim_qk};
    if (!config_.latent_kv) widths.push_back(config_.head_dim_v);
    if (!indexer_exchange) widths.push_back(local.index_k.size(-1));
    const auto parts = gathered.split_with_sizes(widths, -1);
    // A latent's keys are made contiguous so that the values stay a view of them (the
    // attention kernels then gather each row once).
    all.key = config_.latent_kv ? parts[0].contiguous() : parts[0];
    if (!config_.latent_kv) all.value = parts[1];
    if (!indexer_exchange) all.index_k = parts.back();
  }
  if (indexer_exchange) all.index_k = indexer_exchange->finish();
  return all;
}

void DsaLayerImpl::count_selection(const ForwardOptions& options, const Replay& replay,
                                   SelectionStats& stats) const {
  if (options.attention != AttentionMode::kSparse) return;
  if (options.clock->recomputing() && needs_index_queries(options, replay)) {
    ++stats.recomputed_index_queries;
  }
  if (replay.defined()) {
    ++stats.replays;
  } else {
    ++(options.clock->recomputing() ? stats.recompute_selections : stats.selections);
  }
}

DsaLayerImpl::Attention DsaLayerImpl::attend(const QuerySide& queries, const KeySide& keys,
                                             const Chunk& chunk, const ForwardOptions& options,
                                             const Replay& replay) {
  // Causal: the chunk's queries see only the keys before its last position.
  const auto seen = [&chunk](const torch::Tensor& t) {
    return t.defined() ? t.narrow(1, 0, chunk.keys) : t;
  };
  LightningIndexerImpl::Projections index = queries.index;
  index.k = seen(keys.index_k);
  const auto key = seen(keys.key);
  const auto value = config_.latent_kv ? key.narrow(-1, 0, config_.head_dim_v) : seen(keys.value);
  return options.attention == AttentionMode::kDense
             ? dense_attention(queries.q, key, value, index, chunk.positions, options)
             : sparse_attention(queries.q, key, value, index, chunk, options, replay);
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

DsaLayerImpl::Attention DsaLayerImpl::frozen_dense_attention(
    const QuerySide& queries, const KeySide& keys, const Chunk& chunk,
    const ForwardOptions& options, double mean_grad, const torch::Tensor& index_k_grad,
    bool output) {
  const auto key = keys.key.narrow(1, 0, chunk.keys);
  const auto index_k = keys.index_k.narrow(1, 0, chunk.keys).detach();
  const auto& index = queries.index;
  const int64_t batch = queries.q.size(0);
  // The kernels place queries by one q_offset: a non-contiguous chunk goes run by run.
  std::vector<torch::Tensor> out, grad_q, grad_w;
  torch::Tensor loss_sum;
  const double row_grad = mean_grad / static_cast<double>(batch * chunk.length);
  torch::NoGradGuard no_grad;
  for (const auto& run : chunk.runs) {
    const auto rows = [&run](const torch::Tensor& t) {
      return t.narrow(1, run.begin, run.length).detach();
    };
    ops::Attention attention;
    if (output) {
      // The output by the sparse kernels over each row's whole causal prefix: [rows, keys]
      // indices, -1 past a row's position (skipped, not computed), instead of [H, rows, keys]
      // probability tables.
      PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTENTION);
      const auto positions =
          torch::arange(run.offset, run.offset + run.length, key.options().dtype(torch::kInt));
      auto every_key = torch::arange(chunk.keys, positions.options()).expand({run.length, -1});
      every_key = every_key.masked_fill(every_key > positions.unsqueeze(1), -1);
      // One sequence's lists as they are (a view the op takes without copying [rows, keys]).
      every_key =
          batch == 1 ? every_key.unsqueeze(0) : every_key.expand({batch, run.length, chunk.keys});
      attention =
          config_.latent_kv
              ? ops::sparse_attn_latent(rows(queries.q), key, every_key, scale_, config_.head_dim_v)
              : ops::sparse_attn(rows(queries.q), key, keys.value.narrow(1, 0, chunk.keys),
                                 every_key, scale_);
      out.push_back(attention.out);
    }
    {
      PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_INDEXER_LOSS);
      // The attention's log-sum-exps are the output's, where it ran: the loss need not compute
      // them again.
      const auto kl = ops::dense_indexer_kl(rows(queries.q), key, rows(index.q), index_k,
                                            rows(index.w), scale_, run.offset, 1, attention.lse);
      loss_sum = loss_sum.defined() ? loss_sum + kl.loss.sum() : kl.loss.sum();
      grad_q.push_back(kl.grad_q * row_grad);
      grad_w.push_back(kl.grad_w * row_grad);
      index_k_grad.narrow(1, 0, chunk.keys)
          .add_(kl.grad_k.to(index_k_grad.scalar_type()), row_grad);
    }
  }
  const auto join = [](const std::vector<torch::Tensor>& parts) {
    return parts.size() == 1 ? parts[0] : torch::cat(parts, 1);
  };
  {
    // Timed as the backward of the phases that made the indexer's queries.
    PhaseClock::PassGuard pass(*options.clock, v1::STEP_PASS_BWD);
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_INDEXER_LOSS);
    PhaseClock::BackwardAttribution attribution(*options.clock);
    Gradients backward;
    backward.add(index.q, join(grad_q));
    backward.add(index.w, join(grad_w));
    backward.run();
  }
  Attention a;
  if (output) a.out = join(out);
  a.loss = loss_sum / static_cast<double>(batch * chunk.length);
  return a;
}

DsaLayerImpl::Attention DsaLayerImpl::sparse_attention(
    const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value,
    const LightningIndexerImpl::Projections& index, const Chunk& chunk,
    const ForwardOptions& options, const Replay& replay) {
  // With a backward to follow, the loss is formed there (ops::indexer_loss), from the target and
  // the scores' normalizer alone; the forward needs the scores only to know that.
  const bool loss_in_backward = options.indexer_loss && options.indexer_loss_rows.defined();
  const bool wants_lse = loss_in_backward || options.keep_score_lse;
  Attention a;
  torch::Tensor scores;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_SELECTION);
    const bool loss_scores =
        (options.indexer_loss && !loss_in_backward) || (wants_lse && !replay.score_lse.defined());
    auto selection =
        select(index, chunk.runs, config_.topk, config_.index_fp8, replay.indices, loss_scores);
    a.indices = selection.indices;
    scores = selection.scores;
    if (wants_lse) {
      a.score_lse = replay.score_lse.defined() ? replay.score_lse : scores.detach().logsumexp(-1);
    }
  }
  if (loss_in_backward) {
    // Two nodes, timed apart: the loss's backward (indexer_loss_bwd) runs once the attention's
    // (attention_bwd) has formed the target.
    ops::IndexerLossSlots slots;
    {
      PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_INDEXER_LOSS);
      slots = ops::indexer_loss(index.q, index.k, index.w, a.indices, a.score_lse,
                                options.indexer_loss_rows.narrow(1, chunk.begin, chunk.length));
    }
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTENTION);
    const auto attn = ops::sparse_attn_indexer_loss(
        q, key, config_.latent_kv ? torch::Tensor() : value, a.indices, slots, scale_,
        config_.latent_kv ? config_.head_dim_v : 0, options.query_group);
    a.out = attn.out;
    a.loss = attn.loss.mean();
    return a;
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

torch::Tensor DsaLayerImpl::residuals(const torch::Tensor& x, const torch::Tensor& attention_out,
                                      const ForwardOptions& options) {
  torch::Tensor out;
  {
    PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_ATTN_PROJ);
    out =
        x + wo_(attention_out.reshape({x.size(0), x.size(1), config_.heads * config_.head_dim_v}));
  }
  return mlp(out, options);
}

torch::Tensor DsaLayerImpl::mlp(const torch::Tensor& x, const ForwardOptions& options) {
  PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_MLP);
  const auto h = mlp_norm_(x);
  return x + w_down_(torch::silu(w_gate_(h)) * w_up_(h));
}

Replay Replay::rows(int64_t begin, int64_t length) const {
  if (!defined()) return {};
  return {unpack_indices(indices.narrow(1, begin, length)),
          score_lse.defined() ? score_lse.narrow(1, begin, length) : score_lse};
}

LayerOutput DsaLayerImpl::forward(const torch::Tensor& x, const ForwardOptions& options,
                                  const Replay& replay, SelectionStats& stats) {
  const int64_t t = x.size(1);
  const std::vector<Chunk> parts = chunks(x, options);
  count_selection(options, replay, stats);
  torch::Tensor h;  // attn_norm(x), kept for the queries when they run as one chunk
  const KeySide local = key_side(x, parts, options, &h);
  start_exchange(local, options);
  KeySide keys;
  RowAssembler out_x(t, parts.size()), indices(out_x), score_lse(out_x);
  const auto probe_rows = options.probe_rows.defined()
                              ? options.probe_rows.to(torch::kCPU, torch::kLong)
                              : torch::arange(t, torch::kLong);
  std::vector<torch::Tensor> probe_q, probe_indices;
  torch::Tensor loss;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Chunk& c = parts[i];
    const auto x_c = x.narrow(1, c.begin, c.length);
    if (!h.defined()) h = normed(x_c, options);
    const QuerySide queries =
        query_side(h, c.positions, options, needs_index_queries(options, replay));
    if (parts.size() > 1) h = torch::Tensor();
    if (i == 0) keys = finish_exchange(local, options);
    const Attention a = attend(queries, keys, c, options, replay.rows(c.begin, c.length));
    out_x.add(c.begin, residuals(x_c, a.out, options));
    {
      PhaseClock::Scope scope(*options.clock, v1::STEP_PHASE_SELECTION);
      indices.add(c.begin, pack_indices(a.indices, keys.index_k.size(1)));
      score_lse.add(c.begin, a.score_lse);
    }
    if (a.loss.defined()) {
      // The chunk's mean, weighted by its share of the queries: the mean over all of them.
      const auto share = a.loss * (static_cast<double>(c.length) / static_cast<double>(t));
      loss = loss.defined() ? loss + share : share;
    }
    if (options.keep_probes) {
      // The chunk's kept rows, as rows of the chunk.
      const auto mine =
          probe_rows.masked_select((probe_rows >= c.begin) & (probe_rows < c.begin + c.length)) -
          c.begin;
      const auto kept = mine.to(x.device());
      const LightningIndexerImpl::Projections detached{queries.index.q.detach(),
                                                       keys.index_k.narrow(1, 0, c.keys).detach(),
                                                       queries.index.w.detach()};
      const auto selected =
          a.indices.defined()
              ? a.indices
              : select(detached, c.runs, config_.topk, config_.index_fp8, torch::Tensor()).indices;
      probe_q.push_back(queries.q.detach().index_select(1, kept));
      probe_indices.push_back(selected.index_select(1, kept));
    }
  }
  LayerOutput out;
  out.x = out_x.take();
  out.indexer_loss = loss;
  out.indices = indices.take();
  out.score_lse = score_lse.take();
  if (options.keep_probes) {
    out.probe.rows = probe_rows;
    out.probe.q = torch::cat(probe_q, 1);
    out.probe.key = keys.key.detach();
    out.probe.indices = torch::cat(probe_indices, 1);
  }
  return out;
}

DsaLayerImpl::Recomputed DsaLayerImpl::recompute_backward(
    const torch::Tensor& x, const torch::Tensor& grad_out, const torch::Tensor& grad_loss,
    const ForwardOptions& options, const Replay& replay, SelectionStats& stats) {
  torch::AutoGradMode grad_mode(true);
  auto& clock = *options.clock;
  Recomputed result;
  // A sparse layer's indexer loss comes out of the attention backward below: its rows land here.
  ForwardOptions recomputed = options;
  if (options.indexer_loss && options.attention == AttentionMode::kSparse) {
    recomputed.indexer_loss_rows = torch::zeros(
        {x.size(0), x.size(1)},
        x.options().dtype(x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat));
  }
  const auto& loss_rows = recomputed.indexer_loss_rows;
  if (options.query_chunk <= 0 || options.query_chunk >= x.size(1)) {
    // One chunk: the layer again with its graph, and one backward through all of it.
    const auto input = x.detach().requires_grad_(true);
    LayerOutput out;
    {
      PhaseClock::PassGuard pass(clock, v1::STEP_PASS_RECOMPUTE);
      out = forward(input, recomputed, replay, stats);
    }
    Gradients backward;
    backward.add(out.x, grad_out);
    backward.add(out.indexer_loss, grad_loss);
    backward.run();
    result.x_grad = input.grad();
    if (out.indexer_loss.defined()) {
      result.indexer_loss = loss_rows.defined() ? loss_rows.mean() : out.indexer_loss.detach();
    }
    return result;
  }

  // Several chunks. The key side is recomputed without a graph and becomes a leaf (its graph
  // from x is rebuilt chunk by chunk at the end); each chunk's queries then run forward and
  // backward against it, accumulating the key side's gradient.
  const std::vector<Chunk> parts = chunks(x, options);
  const double rows = static_cast<double>(x.size(1));
  KeySide local;
  {
    PhaseClock::PassGuard pass(clock, v1::STEP_PASS_RECOMPUTE);
    count_selection(options, replay, stats);
    torch::NoGradGuard no_grad;
    local = key_side(x, parts, options, nullptr);
  }
  local = {as_leaf(local.key), as_leaf(local.value), as_leaf(local.index_k)};
  {
    PhaseClock::PassGuard pass(clock, v1::STEP_PASS_RECOMPUTE);
    start_exchange(local, options);
  }
  KeySide keys, key_grads;
  const auto accumulate = [](const torch::Tensor& into, const torch::Tensor& seen) {
    if (into.defined() && seen.grad().defined()) {
      into.narrow(1, 0, seen.size(1)).add_(seen.grad());
    }
  };
  auto x_grad = torch::empty_like(x);
  torch::Tensor loss;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Chunk& c = parts[i];
    const auto x_c = x.narrow(1, c.begin, c.length).detach().requires_grad_(true);
    KeySide seen;
    Attention a;
    torch::Tensor out_c, loss_c;
    {
      PhaseClock::PassGuard pass(clock, v1::STEP_PASS_RECOMPUTE);
      const QuerySide queries = query_side(normed(x_c, options), c.positions, options,
                                           needs_index_queries(options, replay));
      if (i == 0) {
        keys = finish_exchange(local, options);
        key_grads = {gradient_accumulator(keys.key), gradient_accumulator(keys.value),
                     gradient_accumulator(keys.index_k)};
      }
      // The keys this chunk sees, as leaves of its own graph.
      const auto prefix = [&c](const torch::Tensor& t) {
        return t.defined() ? as_leaf(t.narrow(1, 0, c.keys)) : t;
      };
      seen = {prefix(keys.key), prefix(keys.value), prefix(keys.index_k)};
      a = attend(queries, seen, c, recomputed, replay.rows(c.begin, c.length));
      out_c = residuals(x_c, a.out, options);
      if (a.loss.defined()) {
        loss_c = a.loss * (static_cast<double>(c.length) / rows);
      }
    }
    Gradients backward;
    backward.add(out_c, grad_out.defined() ? grad_out.narrow(1, c.begin, c.length) : grad_out);
    backward.add(loss_c, grad_loss);
    backward.run();
    accumulate(key_grads.key, seen.key);
    accumulate(key_grads.value, seen.value);
    accumulate(key_grads.index_k, seen.index_k);
    auto chunk_grad = x_grad.narrow(1, c.begin, c.length);
    if (x_c.grad().defined()) {
      chunk_grad.copy_(x_c.grad());
    } else {
      chunk_grad.zero_();
    }
    if (loss_c.defined() && !loss_rows.defined()) {
      const auto value = loss_c.detach();
      loss = loss.defined() ? loss + value : value;
    }
  }
  result.indexer_loss = loss_rows.defined() ? loss_rows.mean() : loss;

  // The key side's gradient: through the exchange's reduce-scatter to this rank's rows (the
  // gathered tensors are then the local leaves themselves), then through the key projections of
  // each chunk into x.
  {
    Gradients backward;
    const auto add = [&backward](const torch::Tensor& t, const torch::Tensor& grad) {
      if (grad.defined()) backward.add(t, grad.to(t.scalar_type()));
    };
    add(keys.key, key_grads.key);
    add(keys.value, key_grads.value);
    add(keys.index_k, key_grads.index_k);
    backward.run();
  }
  for (const Chunk& c : parts) {
    const auto x_c = x.narrow(1, c.begin, c.length).detach().requires_grad_(true);
    KeySide side;
    {
      PhaseClock::PassGuard pass(clock, v1::STEP_PASS_RECOMPUTE);
      side = key_side(normed(x_c, options), c.positions, options);
    }
    const auto mine = [&c](const torch::Tensor& leaf_grad) {
      return leaf_grad.defined() ? leaf_grad.narrow(1, c.begin, c.length) : leaf_grad;
    };
    Gradients backward;
    backward.add(side.key, mine(local.key.grad()));
    if (side.value.defined()) backward.add(side.value, mine(local.value.grad()));
    backward.add(side.index_k, mine(local.index_k.grad()));
    backward.run();
    if (x_c.grad().defined()) x_grad.narrow(1, c.begin, c.length).add_(x_c.grad());
  }
  result.x_grad = x_grad;
  return result;
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

LayerOutput DsaLayerImpl::forward_frozen(const torch::Tensor& x, const ForwardOptions& options,
                                         double grad_scale, SelectionStats& stats, bool output) {
  auto& clock = *options.clock;
  const double rows = static_cast<double>(x.size(1));
  const std::vector<Chunk> parts = chunks(x, options);
  count_selection(options, {}, stats);
  // The key side without a graph; the indexer keys become a leaf whose gradient, accumulated
  // over the chunks, is backpropagated once at the end (through the exchange, then the indexer's
  // key projection chunk by chunk).
  KeySide local;
  torch::Tensor whole_h;  // attn_norm(x), shared with the queries when they run as one chunk
  {
    torch::NoGradGuard no_grad;
    local = key_side(x, parts, options, &whole_h);
  }
  local.index_k = as_leaf(local.index_k);
  start_exchange(local, options);
  KeySide keys;
  torch::Tensor index_k_grad, loss;
  RowAssembler out_x(x.size(1), parts.size());  // filled without a graph: in place
  // Dense with the loss: output and loss over every visible key without [H, rows, keys] tables.
  const bool key_lists = options.attention == AttentionMode::kDense && options.indexer_loss;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Chunk& c = parts[i];
    const auto x_c = x.narrow(1, c.begin, c.length);
    torch::Tensor h = whole_h;
    if (!h.defined()) {
      torch::NoGradGuard no_grad;
      h = normed(x_c, options);
    }
    QuerySide queries = query_side(h, c.positions, options, needs_index_queries(options, {}));
    queries.q = queries.q.detach();  // the frozen model builds no graph, whatever it requires
    if (i == 0) {
      keys = finish_exchange(local, options);
      index_k_grad = gradient_accumulator(keys.index_k);
    }
    KeySide seen{keys.key.narrow(1, 0, c.keys).detach(),
                 keys.value.defined() ? keys.value.narrow(1, 0, c.keys).detach() : keys.value,
                 as_leaf(keys.index_k.narrow(1, 0, c.keys))};
    const double chunk_share = static_cast<double>(c.length) / rows;
    const Attention a = key_lists
                            ? frozen_dense_attention(queries, keys, c, options,
                                                     grad_scale * chunk_share, index_k_grad, output)
                            : attend(queries, seen, c, options, {});
    if (output) {
      torch::NoGradGuard no_grad;
      out_x.add(c.begin, residuals(x_c, a.out.detach(), options));
    }
    if (!a.loss.defined()) continue;
    const auto share = a.loss * chunk_share;
    loss = loss.defined() ? loss + share.detach() : share.detach();
    if (key_lists) continue;
    {
      // Timed as the backward of the phases that made the graph; the scope returns the clock to
      // the forward afterwards.
      PhaseClock::PassGuard pass(clock, v1::STEP_PASS_BWD);
      PhaseClock::Scope scope(clock, v1::STEP_PHASE_INDEXER_LOSS);
      PhaseClock::BackwardAttribution attribution(clock);
      Gradients backward;
      backward.add(share, torch::full({}, grad_scale, share.options()));
      backward.run();
    }
    if (seen.index_k.grad().defined()) {
      index_k_grad.narrow(1, 0, c.keys).add_(seen.index_k.grad());
    }
  }
  {
    PhaseClock::PassGuard pass(clock, v1::STEP_PASS_BWD);
    PhaseClock::Scope selection(clock, v1::STEP_PHASE_SELECTION);
    PhaseClock::BackwardAttribution attribution(clock);
    Gradients backward;
    backward.add(keys.index_k, index_k_grad.to(keys.index_k.scalar_type()));
    backward.run();
    for (const Chunk& c : parts) {
      torch::Tensor index_k;
      {
        PhaseClock::PassGuard recompute(clock, v1::STEP_PASS_RECOMPUTE);
        torch::Tensor h;
        {
          torch::NoGradGuard no_grad;
          h = normed(x.narrow(1, c.begin, c.length), options);
        }
        PhaseClock::Scope scope(clock, v1::STEP_PHASE_SELECTION);
        index_k = indexer_->project_keys(h, c.positions);
      }
      Gradients keys_backward;
      if (local.index_k.grad().defined()) {
        keys_backward.add(index_k, local.index_k.grad().narrow(1, c.begin, c.length));
      }
      keys_backward.run();
    }
  }
  LayerOutput out;
  if (output) out.x = out_x.take();
  out.indexer_loss = loss;
  return out;
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
  if (options.frozen_main && options.indexer_loss && torch::GradMode::is_enabled()) {
    x = x.detach();
    const auto dtype = x.scalar_type();
    for (size_t l = 0; l < layers_.size(); ++l) {
      // Without logits the last layer's output has no reader.
      const bool output = options.frozen_logits || l + 1 < layers_.size();
      LayerOutput out = layers_[l]->forward_frozen(
          x, options, options.indexer_grad_scale * per_layer, stats_, output);
      x = out.x;
      if (out.indexer_loss.defined()) {
        result.indexer_loss_value.add_(out.indexer_loss.to(dtype) * per_layer);
      }
    }
    if (options.frozen_logits) {
      PhaseClock::Scope scope(clock, v1::STEP_PHASE_LM_HEAD);
      torch::NoGradGuard no_grad;
      result.logits = lm_head_(final_norm_(x));
    }
    result.indexer_loss = result.indexer_loss_value.clone();
    return result;
  }
  const bool recompute = options.recompute && torch::GradMode::is_enabled();
  // Without recomputation a sparse step's backward follows this forward too: its attention
  // backward forms the loss's target (as under recomputation) and writes each layer's rows here.
  const bool target_in_backward = !recompute && torch::GradMode::is_enabled() &&
                                  options.attention == AttentionMode::kSparse &&
                                  options.indexer_loss && !options.indexer_loss_rows.defined();
  if (target_in_backward) {
    result.indexer_loss_rows = torch::zeros(
        {static_cast<int64_t>(layers_.size()), x.size(0), x.size(1)},
        x.options().dtype(x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat));
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto& layer = layers_[l];
    ForwardOptions layer_options = options;
    if (target_in_backward) layer_options.indexer_loss_rows = result.indexer_loss_rows[l];
    LayerOutput out = recompute ? checkpointed_layer(layer, x, options, stats_,
                                                     result.indexer_loss_value, per_layer)
                                : layer->forward(x, layer_options, {}, stats_);
    x = out.x;
    if (out.indexer_loss.defined()) losses.push_back(out.indexer_loss);
    if (out.indexer_loss.defined() && !recompute && !target_in_backward) {
      torch::NoGradGuard no_grad;
      result.indexer_loss_value.add_(out.indexer_loss.detach().to(x.scalar_type()) * per_layer);
    }
    if (options.keep_probes) result.probes.push_back(out.probe);
  }
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_LM_HEAD);
    // Recomputed in the backward, where it re-enters the forward's autocast and phase.
    const auto head = [this, clock_ptr = options.clock,
                       bf16 = options.bf16_autocast](const torch::Tensor& h) {
      compat::CudaBf16Autocast autocast(bf16);
      PhaseClock::Scope lm_head(*clock_ptr, v1::STEP_PHASE_LM_HEAD);
      return lm_head_(final_norm_(h));
    };
    result.logits = recompute ? checkpointed(head, x, options.clock) : head(x);
  }
  PhaseClock::Scope scope(clock, v1::STEP_PHASE_INDEXER_LOSS);
  result.indexer_loss =
      losses.empty() ? torch::zeros({}, x.options()) : torch::stack(losses).mean();
  return result;
}

torch::Tensor ForwardResult::reported_indexer_loss() const {
  if (!indexer_loss_rows.defined()) return indexer_loss_value;
  torch::NoGradGuard no_grad;
  return indexer_loss_value + indexer_loss_rows.mean().to(indexer_loss_value.scalar_type());
}

std::vector<torch::Tensor> DsaModelImpl::indexer_parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& layer : layers_) {
    for (const auto& p : layer->indexer_parameters()) params.push_back(p);
  }
  return params;
}

}  // namespace hyscale::trainer
