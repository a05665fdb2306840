// The DSA transformer (DESIGN.md section 2): decoder-only, each layer RMSNorm -> MQA attention
// with a lightning indexer -> RMSNorm -> SwiGLU MLP. Attention is dense or sparse (the indexer's
// top-k); the indexer learns only from its KL loss against the main attention.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "hyscale/v1/job.pb.h"
#include "worker/model/phases.h"

namespace hyscale::trainer {

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t head_dim_qk = 0;
  int64_t rope_dim = 0;
  int64_t head_dim_v = 0;
  int64_t d_ff = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  int64_t index_heads = 0;
  int64_t index_dim = 0;
  int64_t index_rope_dim = 0;
  int64_t topk = 0;
  bool index_fp8 = false;  // select with fp8 index scores (flash_topk's fp8 option)
  bool latent_kv = false;  // value = the key's first head_dim_v features, RoPE on its last rope_dim

  // `spec` with ApplyDefaults applied (proto/job_spec.h owns the defaults).
  static ModelConfig FromSpec(const v1::ModelSpec& spec);
};

enum class AttentionMode { kDense, kSparse };

// How each layer obtained its selection. Tests use it to prove that replay never re-selects.
struct SelectionStats {
  int64_t selections = 0;            // flash_topk calls in forward
  int64_t recompute_selections = 0;  // flash_topk calls during recomputation (replay off)
  int64_t replays = 0;  // recomputations that replayed the forward's indices (replay on)
  // Recomputations that projected the indexer's queries (none replays without the indexer loss).
  int64_t recomputed_index_queries = 0;
};

// How a layer's key side reaches the queries of other ranks under context parallelism
// (worker/parallel implements it over a communicator). A layer calls start() with its key-side
// features, computes its query side meanwhile, and finish() returns every rank's features in
// global sequence order; gradients flow back to `local`. Without one, a layer holds the whole
// sequence.
class KeyExchange {
 public:
  virtual ~KeyExchange() = default;
  // Global positions of this rank's tokens, [T] int64, increasing.
  virtual torch::Tensor positions() const = 0;
  // local [B, T, F] -> (after finish) [B, N, F] for the N tokens of all ranks.
  virtual void start(const torch::Tensor& local) = 0;
  virtual torch::Tensor finish() = 0;
};

// What one forward pass computes and keeps.
struct ForwardOptions {
  AttentionMode attention = AttentionMode::kSparse;
  bool indexer_loss = true;
  bool recompute = false;        // per-layer activation recomputation
  bool selection_replay = true;  // in recomputation, replay the forward's indices
  bool keep_probes = false;      // keep per-layer tensors for evaluation (indexer recall)
  // Sparse: return each row's score_lse with the selection (LayerOutput), for a recomputation
  // that replays it and trains the indexer (Replay).
  bool keep_score_lse = false;
  // With keep_probes: the local query rows [R] (int64, increasing) whose queries and selection
  // the probes keep; undefined: every row (a probe's q is H d_qk a token and layer).
  torch::Tensor probe_rows;
  bool bf16_autocast = false;  // CUDA: matmuls in bf16 (recomputation re-enters it)
  int64_t query_group = 0;     // G of the sparse attention kernels (0: theirs by default)
  // Queries a layer runs at once, forward, recomputation and backward; 0: all of them. Under
  // recomputation only the key side (keys, values, indexer keys and their gradients), the layer's
  // input and output and the top-k indices are held for the whole sequence.
  int64_t query_chunk = 0;
  // The main model is frozen (an INDEXER_ONLY stage, e.g. the dense warm-up): only the indexer
  // learns, so no layer keeps anything for a backward. Each layer's indexer loss is
  // backpropagated where it is computed, a query chunk at a time, into the indexer's parameters,
  // scaled by indexer_grad_scale (the loss's weight in the step); the result's indexer_loss is a
  // value without a graph, and `recompute` does not apply.
  bool frozen_main = false;
  double indexer_grad_scale = 1;
  // With frozen_main: compute the logits. False (a frozen step that reports no LM loss): the last
  // layer computes only its indexer loss (no attention output, MLP or LM head; the result has no
  // logits), the dense warm-up's largest saving after the loss itself.
  bool frozen_logits = true;
  // Set where a backward follows (the recomputation, or a sparse step that trains without it):
  // [B, T] (the layer's query rows). Sparse attention then takes the indexer loss's target from
  // its own backward (ops::sparse_attn_indexer_loss) rather than computing it in the forward, and
  // the loss's backward that follows (ops::indexer_loss) writes each row's loss here; the layer's
  // indexer_loss is then only a gradient handle (0).
  torch::Tensor indexer_loss_rows;
  c10::intrusive_ptr<PhaseClock> clock = c10::make_intrusive<PhaseClock>();
  std::shared_ptr<KeyExchange> key_exchange;  // context parallelism; null: the whole sequence
  // The indexer keys' own exchange (a separate CP group); null: they travel with key_exchange.
  std::shared_ptr<KeyExchange> indexer_key_exchange;
};

// Per-layer tensors kept for evaluation: main queries/keys and the indexer's selection.
struct LayerProbe {
  torch::Tensor rows;     // [R] the local query rows kept (ForwardOptions::probe_rows, or all)
  torch::Tensor q;        // [B, R, H, d_qk] after RoPE
  torch::Tensor key;      // [B, N, d_qk] after RoPE, every key
  torch::Tensor indices;  // [B, R, topk] the indexer's top-k
};

struct ForwardResult {
  torch::Tensor logits;  // [B, T, vocab]; undefined in a frozen step without frozen_logits
  // Scalar, differentiable: KL averaged over queries and layers (0 if disabled). In a sparse step
  // that trains, only its gradient is right (its value is 0): the loss is computed in backward,
  // by the recomputation or by the attention backward that forms the loss's target.
  torch::Tensor indexer_loss;
  // The loss's value as computed so far, detached: the forward's, and what recomputation adds in
  // backward, times 1/layers.
  torch::Tensor indexer_loss_value;
  // A sparse step without recomputation: each layer's per-row loss [layers, B, T], written by the
  // attention backward; undefined otherwise.
  torch::Tensor indexer_loss_rows;
  std::vector<LayerProbe> probes;

  // The indexer loss's value, detached, once backward has run (before it, what the forward knew).
  torch::Tensor reported_indexer_loss() const;
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Rotary embedding on `rope_dim` features from feature `first` on (rotate-half pairing).
class Rope {
 public:
  Rope(int64_t rope_dim, double theta, int64_t first = 0)
      : rope_dim_(rope_dim), theta_(theta), first_(first) {}
  // x [B, T, ..., D]; positions [T] (global token positions, int64).
  torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& positions) const;

 private:
  int64_t rope_dim_;
  double theta_;
  int64_t first_;
};

// Lightning indexer: scores I[t, s] = sum_j w[t, j] * ReLU(q_I[t, j] . k_I[s]).
class LightningIndexerImpl : public torch::nn::Module {
 public:
  explicit LightningIndexerImpl(const ModelConfig& config);

  struct Projections {
    torch::Tensor q;  // [B, T, H_I, d_I]
    torch::Tensor k;  // [B, T, d_I]
    torch::Tensor w;  // [B, T, H_I], scaled by (H_I * d_I)^-1/2
  };
  // The key side (k) and the query side (q, w) separately, so that context parallelism can
  // exchange keys while queries are projected; positions [T] as in Rope::apply.
  torch::Tensor project_keys(const torch::Tensor& h, const torch::Tensor& positions);
  void project_queries(const torch::Tensor& h, const torch::Tensor& positions, Projections& p);

  // Dense scores [B, T, M] with -inf where visible [T, M] is false (dense stage and tests only).
  static torch::Tensor dense_scores(const Projections& p, const torch::Tensor& visible);

 private:
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, ww_{nullptr};
  torch::nn::LayerNorm k_norm_{nullptr};
  Rope rope_;
  double weight_scale_;
};
TORCH_MODULE(LightningIndexer);

struct LayerOutput {
  torch::Tensor x;
  torch::Tensor indexer_loss;  // scalar mean over queries; undefined when not computed
  // Sparse mode: the selection used, packed for replay (index_packing.h; replay takes it so).
  torch::Tensor indices;
  torch::Tensor score_lse;  // with ForwardOptions::keep_score_lse: [B, T] (Replay)
  LayerProbe probe;
};

// A forward's selection, replayed by its recomputation: the indices (packed as
// LayerOutput::indices holds them, or int32) and, where the indexer loss follows, each row's
// score_lse [B, T]: the log-sum-exp of its index scores over its valid slots, the loss's
// normalizer. With it the recomputation forms no scores: the loss's backward forms them
// (ops::sparse_attn_indexer_loss).
struct Replay {
  torch::Tensor indices;
  torch::Tensor score_lse;
  bool defined() const { return indices.defined(); }
  // Rows [begin, begin + length): the indices unpacked to int32.
  Replay rows(int64_t begin, int64_t length) const;
};

class DsaLayerImpl : public torch::nn::Module {
 public:
  explicit DsaLayerImpl(const ModelConfig& config);

  // replay: a selection made by an earlier forward of this layer on the same input
  // (recomputation); when given, nothing is selected again. Runs the queries
  // options.query_chunk at a time.
  LayerOutput forward(const torch::Tensor& x, const ForwardOptions& options, const Replay& replay,
                      SelectionStats& stats);

  struct Recomputed {
    torch::Tensor x_grad;        // the gradient of the layer's input
    torch::Tensor indexer_loss;  // the recomputed loss's value, detached; undefined if not computed
  };
  // The backward of a layer whose forward kept only its input x (recompute.h): runs the layer
  // again and backpropagates grad_out (and grad_loss, the indexer loss's gradient, if defined)
  // through it; the parameters' gradients accumulate. With several query chunks each chunk's
  // queries are recomputed and backpropagated in turn against the whole key side, whose gradient
  // is accumulated (in fp32 at least) and backpropagated once at the end.
  Recomputed recompute_backward(const torch::Tensor& x, const torch::Tensor& grad_out,
                                const torch::Tensor& grad_loss, const ForwardOptions& options,
                                const Replay& replay, SelectionStats& stats);

  // options.frozen_main: the frozen layer's output (unless `output` is false: none) and its indexer
  // loss's value, both without a graph (no indices: nothing replays them); on the way the loss
  // times `grad_scale` is backpropagated into the indexer's parameters (and, under context
  // parallelism, its keys' gradients to their ranks).
  LayerOutput forward_frozen(const torch::Tensor& x, const ForwardOptions& options,
                             double grad_scale, SelectionStats& stats, bool output = true);

  std::vector<torch::Tensor> indexer_parameters() const { return indexer_->parameters(); }

 private:
  struct Chunk;  // a run of query rows (model.cc)
  // What every query reads: this rank's rows, or after the exchange the whole sequence's.
  struct KeySide {
    torch::Tensor key;      // [B, rows, d_qk] after RoPE; a latent's first d_v features: values
    torch::Tensor value;    // [B, rows, d_v]; undefined with a latent
    torch::Tensor index_k;  // [B, rows, d_I]
  };
  // What belongs to the queries of one chunk.
  struct QuerySide {
    torch::Tensor q;                          // [B, rows, H, d_qk] after RoPE
    LightningIndexerImpl::Projections index;  // q and w (k is the key side's)
  };
  struct Attention {
    torch::Tensor out;   // [B, rows, H, d_v]
    torch::Tensor loss;  // indexer KL, scalar mean over the chunk's queries, or undefined
    torch::Tensor indices;
    torch::Tensor score_lse;  // with ForwardOptions::keep_score_lse
  };

  // The query rows in chunks of options.query_chunk: one chunk when it is 0 or >= the rows.
  std::vector<Chunk> chunks(const torch::Tensor& x, const ForwardOptions& options) const;
  torch::Tensor normed(const torch::Tensor& x, const ForwardOptions& options);  // attn_norm, timed
  KeySide key_side(const torch::Tensor& h, const torch::Tensor& positions,
                   const ForwardOptions& options);
  // The key side of all rows, projected chunk by chunk; `h` gets attn_norm(x) if one chunk.
  KeySide key_side(const torch::Tensor& x, const std::vector<Chunk>& chunks,
                   const ForwardOptions& options, torch::Tensor* h);
  // The indexer's queries are projected only where something reads them (index_queries):
  // selection, the indexer loss, or the evaluation's probes.
  QuerySide query_side(const torch::Tensor& h, const torch::Tensor& positions,
                       const ForwardOptions& options, bool index_queries);
  bool needs_index_queries(const ForwardOptions& options, const Replay& replay) const;
  // Under context parallelism the key side travels while the first chunk's queries are
  // projected; without it, finish_exchange returns `local`.
  void start_exchange(const KeySide& local, const ForwardOptions& options);
  KeySide finish_exchange(const KeySide& local, const ForwardOptions& options);
  void count_selection(const ForwardOptions& options, const Replay& replay,
                       SelectionStats& stats) const;
  // One chunk's attention over `keys` (at least the keys its queries see).
  Attention attend(const QuerySide& queries, const KeySide& keys, const Chunk& chunk,
                   const ForwardOptions& options, const Replay& replay);
  Attention dense_attention(const torch::Tensor& q, const torch::Tensor& key,
                            const torch::Tensor& value,
                            const LightningIndexerImpl::Projections& index,
                            const torch::Tensor& positions, const ForwardOptions& options);
  // options.frozen_main, dense: the chunk's attention output without a graph (with `output`) and
  // its indexer loss (the mean over its rows, a value) by ops::dense_indexer_kl, which holds no
  // [N, M] table (without the output, it makes the attention's log-sum-exps itself). The
  // loss's gradients times `mean_grad` (the gradient of that mean) go into the indexer's query
  // side here, by autograd, and into `index_k_grad` [B, >= keys, d_I] for its keys.
  Attention frozen_dense_attention(const QuerySide& queries, const KeySide& keys,
                                   const Chunk& chunk, const ForwardOptions& options,
                                   double mean_grad, const torch::Tensor& index_k_grad,
                                   bool output);
  Attention sparse_attention(const torch::Tensor& q, const torch::Tensor& key,
                             const torch::Tensor& value,
                             const LightningIndexerImpl::Projections& index, const Chunk& chunk,
                             const ForwardOptions& options, const Replay& replay);
  // x plus the attention's output projection, then plus the MLP of that.
  torch::Tensor residuals(const torch::Tensor& x, const torch::Tensor& attention_out,
                          const ForwardOptions& options);
  // x plus the MLP of x.
  torch::Tensor mlp(const torch::Tensor& x, const ForwardOptions& options);

  ModelConfig config_;
  RMSNorm attn_norm_{nullptr}, mlp_norm_{nullptr};
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
  torch::nn::Linear w_gate_{nullptr}, w_up_{nullptr}, w_down_{nullptr};
  LightningIndexer indexer_{nullptr};
  Rope rope_;
  double scale_;
};
TORCH_MODULE(DsaLayer);

class DsaModelImpl : public torch::nn::Module {
 public:
  explicit DsaModelImpl(const ModelConfig& config);

  // tokens [B, T] int64.
  ForwardResult forward(const torch::Tensor& tokens, const ForwardOptions& options);

  const ModelConfig& config() const { return config_; }
  const SelectionStats& selection_stats() const { return stats_; }
  // Parameters of every layer's indexer; the rest is the "main" model.
  std::vector<torch::Tensor> indexer_parameters() const;

 private:
  ModelConfig config_;
  torch::nn::Embedding embedding_{nullptr};
  std::vector<DsaLayer> layers_;
  RMSNorm final_norm_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
  SelectionStats stats_;
};
TORCH_MODULE(DsaModel);

}  // namespace hyscale::trainer
