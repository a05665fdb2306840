// The DSA model: recomputation with selection replay gives the same gradients as re-selection
// and as no recomputation, without selecting again; the indexer and the main model learn from
// their own losses only; sparse attention over every key is dense attention.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>

#include "proto/events.h"
#include "tests/model/small_model.h"
#include "worker/model/index_packing.h"
#include "worker/model/model.h"

namespace hyscale::trainer {
namespace {

struct TrainedOnce {
  std::map<std::string, torch::Tensor> grads;
  torch::Tensor logits;
  SelectionStats stats;
  double indexer_loss = 0;  // the reported value, read after backward
};

// What a step left: the parameters' gradients, the logits and the reported indexer loss (read
// after backward), the selection counts.
TrainedOnce trained(const DsaModel& model, const ForwardResult& result) {
  TrainedOnce run;
  for (const auto& p : model->named_parameters()) {
    if (p.value().grad().defined()) run.grads[p.key()] = p.value().grad().clone();
  }
  if (result.logits.defined()) run.logits = result.logits.detach();
  run.indexer_loss = result.reported_indexer_loss().item<double>();
  run.stats = model->selection_stats();
  return run;
}

// One forward + backward of lm_loss + indexer_loss on a fixed batch, from a fixed init.
TrainedOnce run_once(const ModelConfig& config, const ForwardOptions& options, bool lm = true,
                     bool indexer = true, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(7);
  DsaModel model(config);
  model->to(dtype);
  const auto tokens = torch::randint(config.vocab_size, {2, 19}, torch::kLong);
  auto result = model->forward(tokens, options);
  torch::Tensor loss = torch::zeros({});
  if (lm) {
    loss = loss + torch::nn::functional::cross_entropy(result.logits.view({-1, config.vocab_size}),
                                                       tokens.view(-1));
  }
  if (indexer) loss = loss + result.indexer_loss;
  loss.backward();
  return trained(model, result);
}

ForwardOptions sparse(bool recompute, bool replay) {
  ForwardOptions o;
  o.attention = AttentionMode::kSparse;
  o.recompute = recompute;
  o.selection_replay = replay;
  return o;
}

void expect_identical(const TrainedOnce& a, const TrainedOnce& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, grad] : a.grads) {
    ASSERT_TRUE(b.grads.count(name)) << name;
    EXPECT_TRUE(torch::equal(grad, b.grads.at(name))) << name;
  }
}

TEST(ModelTest, ReplayGivesTheGradientsOfReselectionAndOfNoRecompute) {
  const auto config = testing::SmallConfig();
  const TrainedOnce plain = run_once(config, sparse(false, false));
  const TrainedOnce replay = run_once(config, sparse(true, true));
  const TrainedOnce reselect = run_once(config, sparse(true, false));
  expect_identical(replay, reselect);
  expect_identical(replay, plain);
  EXPECT_GT(replay.grads.size(), 0u);
}

TEST(ModelTest, ReplayNeverSelectsDuringRecomputation) {
  const auto config = testing::SmallConfig();
  const TrainedOnce replay = run_once(config, sparse(true, true));
  EXPECT_EQ(replay.stats.selections, config.layers);
  EXPECT_EQ(replay.stats.recompute_selections, 0);
  EXPECT_EQ(replay.stats.replays, config.layers);
  const TrainedOnce reselect = run_once(config, sparse(true, false));
  EXPECT_EQ(reselect.stats.recompute_selections, config.layers);
  EXPECT_EQ(reselect.stats.replays, 0);
}

// Without the indexer loss, replay neither projects the indexer's queries nor rescores the
// selected keys in recomputation, and the main model still trains as without recomputation.
TEST(ModelTest, WithoutTheIndexerLossReplayProjectsNoIndexerQueries) {
  const auto config = testing::SmallConfig();
  const auto no_loss = [](ForwardOptions o) {
    o.indexer_loss = false;
    return o;
  };
  const TrainedOnce plain = run_once(config, no_loss(sparse(false, false)), true, false);
  const TrainedOnce replay = run_once(config, no_loss(sparse(true, true)), true, false);
  const TrainedOnce reselect = run_once(config, no_loss(sparse(true, false)), true, false);
  expect_identical(replay, plain);
  expect_identical(replay, reselect);
  for (const auto& [name, grad] : replay.grads) {
    EXPECT_EQ(name.find("indexer"), std::string::npos) << name << " has a gradient";
  }
  EXPECT_EQ(replay.stats.replays, config.layers);
  EXPECT_EQ(replay.stats.recomputed_index_queries, 0);
  EXPECT_EQ(reselect.stats.recomputed_index_queries, config.layers);  // it selects again
  EXPECT_EQ(run_once(config, sparse(true, true)).stats.recomputed_index_queries, config.layers);
}

// fp8 index scores select; the loss rescores the selected keys in full precision, so replay,
// re-selection and no recomputation give the same gradients; and fp8 changes what is selected.
TEST(ModelTest, Fp8SelectionReplaysLikeReselection) {
  auto config = testing::SmallConfig();
  config.index_fp8 = true;
  const TrainedOnce plain = run_once(config, sparse(false, false));
  const TrainedOnce replay = run_once(config, sparse(true, true));
  const TrainedOnce reselect = run_once(config, sparse(true, false));
  expect_identical(replay, reselect);
  expect_identical(replay, plain);
  EXPECT_EQ(replay.stats.replays, config.layers);
  EXPECT_EQ(reselect.stats.recompute_selections, config.layers);
  config.index_fp8 = false;
  const TrainedOnce bf16 = run_once(config, sparse(true, true));
  bool differs = false;
  for (const auto& [name, grad] : bf16.grads) differs |= !torch::equal(grad, replay.grads.at(name));
  EXPECT_TRUE(differs) << "fp8 and bf16 index scores trained identically";
}

// model.latent_kv: the values are the keys' first head_dim_v features (no value projection),
// RoPE the keys' and queries' last rope_dim; replay, re-selection and no recomputation still
// train alike, dense attention too, and the keys' gradient carries the values'.
TEST(ModelTest, LatentKvTakesTheValuesFromTheKeys) {
  auto config = testing::SmallConfig();
  config.latent_kv = true;
  config.head_dim_qk = config.head_dim_v + config.rope_dim;
  const TrainedOnce plain = run_once(config, sparse(false, false));
  const TrainedOnce replay = run_once(config, sparse(true, true));
  const TrainedOnce reselect = run_once(config, sparse(true, false));
  expect_identical(replay, reselect);
  expect_identical(replay, plain);
  ForwardOptions dense = sparse(false, false);
  dense.attention = AttentionMode::kDense;
  const TrainedOnce dense_run = run_once(config, dense);
  for (const auto* run : {&plain, &dense_run}) {
    bool has_keys = false;
    for (const auto& [name, grad] : run->grads) {
      EXPECT_EQ(name.find(".wv."), std::string::npos)
          << name << ": a latent has no values of its own";
      EXPECT_TRUE(grad.isfinite().all().item<bool>()) << name;
      has_keys |= name.find(".wk.") != std::string::npos;
    }
    EXPECT_TRUE(has_keys);
  }
}

bool is_indexer(const std::string& name) {
  return name.find(".indexer.") != std::string::npos;
}

void expect_close(const TrainedOnce& got, const TrainedOnce& want, const std::string& what) {
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, grad] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::allclose(got.grads.at(name), grad, 1e-10, 1e-12))
        << what << ": " << name << " max |diff| "
        << (got.grads.at(name) - grad).abs().max().item<double>();
  }
  // (A frozen step without logits: the rest as with them.)
  if (got.logits.defined()) {
    EXPECT_TRUE(torch::allclose(got.logits, want.logits, 1e-10, 1e-12)) << what;
  }
  EXPECT_NEAR(got.indexer_loss, want.indexer_loss, 1e-12) << what;
}

// options.query_chunk: a layer runs its queries a chunk at a time (forward, recomputation and
// backward) and trains exactly as it does on the whole sequence, in float64, for chunks that do
// and do not divide the sequence (19 tokens), one row a chunk included; under recomputation
// replay and re-selection stay bit-identical and replay still never selects.
TEST(ModelTest, QueryChunksTrainLikeTheWholeSequence) {
  for (const bool latent : {false, true}) {
    auto config = testing::SmallConfig();
    config.latent_kv = latent;
    if (latent) config.head_dim_qk = config.head_dim_v + config.rope_dim;
    for (const auto mode : {AttentionMode::kSparse, AttentionMode::kDense}) {
      ForwardOptions whole = sparse(false, false);
      whole.attention = mode;
      const TrainedOnce want = run_once(config, whole, true, true, torch::kDouble);
      for (const int64_t chunk : {1, 4, 7, 19, 64}) {
        for (const bool recompute : {false, true}) {
          ForwardOptions o = sparse(recompute, true);
          o.attention = mode;
          o.query_chunk = chunk;
          const std::string what = std::string(latent ? "latent " : "") +
                                   (mode == AttentionMode::kDense ? "dense" : "sparse") +
                                   (recompute ? " recomputed" : "") + ", chunks of " +
                                   std::to_string(chunk);
          const TrainedOnce replay = run_once(config, o, true, true, torch::kDouble);
          expect_close(replay, want, what);
          if (recompute && mode == AttentionMode::kSparse) {
            EXPECT_EQ(replay.stats.recompute_selections, 0) << what;
            EXPECT_EQ(replay.stats.replays, config.layers) << what;
            o.selection_replay = false;
            expect_identical(run_once(config, o, true, true, torch::kDouble), replay);
          }
        }
      }
    }
  }
}

// An INDEXER_ONLY step of a float64 model: the main model's parameters frozen, the indexer's
// gradients of `weight` x indexer loss (by autograd after the forward, or with frozen_main inside
// it), the logits and the loss's value, on `batch` sequences.
TrainedOnce indexer_only_step(const ModelConfig& config, const ForwardOptions& options,
                              double weight, int64_t batch = 2) {
  torch::manual_seed(7);
  DsaModel model(config);
  model->to(torch::kDouble);
  for (auto& p : model->named_parameters()) p.value().set_requires_grad(is_indexer(p.key()));
  const auto tokens = torch::randint(config.vocab_size, {batch, 19}, torch::kLong);
  auto result = model->forward(tokens, options);
  if (!options.frozen_main) (weight * result.indexer_loss).backward();
  return trained(model, result);
}

// options.frozen_main (INDEXER_ONLY stages, the dense warm-up): the indexer learns inside the
// forward, layer by layer and chunk by chunk, exactly as autograd after the whole forward
// teaches it, and nothing else gets a gradient; without frozen_logits (the trainer's step) the
// same, with no logits (the last layer's loss takes no attention output).
TEST(ModelTest, FrozenMainModelTrainsTheIndexerInsideTheForward) {
  for (const bool latent : {false, true}) {
    auto config = testing::SmallConfig();
    config.latent_kv = latent;
    if (latent) config.head_dim_qk = config.head_dim_v + config.rope_dim;
    // (One sequence: the dense key lists go to the attention as a view, a batch as copies.)
    for (const auto mode : {AttentionMode::kDense, AttentionMode::kSparse}) {
      for (const int64_t batch : {1, 2}) {
        ForwardOptions whole;
        whole.attention = mode;
        const TrainedOnce want = indexer_only_step(config, whole, 0.3, batch);
        for (const int64_t chunk : {0, 1, 6}) {
          ForwardOptions frozen = whole;
          frozen.frozen_main = true;
          frozen.indexer_grad_scale = 0.3;
          frozen.query_chunk = chunk;
          const std::string what = std::string(latent ? "latent " : "") +
                                   (mode == AttentionMode::kDense ? "dense" : "sparse") +
                                   ", batch " + std::to_string(batch) + ", chunks of " +
                                   std::to_string(chunk);
          const TrainedOnce got = indexer_only_step(config, frozen, 0.3, batch);
          expect_close(got, want, what);
          for (const auto& [name, grad] : got.grads) EXPECT_TRUE(is_indexer(name)) << name;
          frozen.frozen_logits = false;
          const TrainedOnce no_logits = indexer_only_step(config, frozen, 0.3, batch);
          EXPECT_FALSE(no_logits.logits.defined()) << what;
          expect_close(no_logits, want, what + ", no logits");
        }
      }
    }
  }
}

// Replay's indices kept in 2 bytes an entry up to 65,535 keys and 3 beyond, exactly: -1, 0 and
// the largest key at each width's edge, and random entries.
TEST(ModelTest, PackedIndicesUnpackExactlyInTwoOrThreeBytes) {
  for (const int64_t keys : {int64_t(1), int64_t(65535), int64_t(65536), kMaxPackedKeys}) {
    auto indices = torch::randint(-1, keys, {2, 5, 7}, torch::kInt);
    indices[0][0][0] = -1;
    indices[0][0][1] = 0;
    indices[0][0][2] = static_cast<int32_t>(keys - 1);
    const auto packed = pack_indices(indices, keys);
    const int64_t width = keys <= 65535 ? 2 : 3;
    EXPECT_EQ(packed.numel() * packed.element_size(), indices.numel() * width) << keys << " keys";
    EXPECT_TRUE(torch::equal(unpack_indices(packed), indices)) << keys << " keys";
    EXPECT_TRUE(torch::equal(unpack_indices(indices), indices));  // int32 passes through
  }
  EXPECT_FALSE(pack_indices(torch::Tensor(), 10).defined());
  EXPECT_THROW(pack_indices(torch::zeros({3}, torch::kInt), kMaxPackedKeys + 1), c10::Error);
}

// A recomputed sparse layer keeps its selection packed (2 bytes an entry at this length), and
// replaying it trains as the forward did (ReplayGivesTheGradientsOfReselectionAndOfNoRecompute).
TEST(ModelTest, SparseLayersKeepTheirSelectionPacked) {
  torch::manual_seed(3);
  const auto config = testing::SmallConfig();
  DsaLayer layer(config);
  layer->to(torch::kDouble);
  const auto x = torch::randn({2, 19, config.d_model}, torch::kDouble);
  ForwardOptions options;
  SelectionStats stats;
  const LayerOutput out = layer->forward(x, options, {}, stats);
  ASSERT_TRUE(out.indices.defined());
  EXPECT_EQ(out.indices.scalar_type(), torch::kShort);
  const LayerOutput replayed = layer->forward(x, options, {out.indices, {}}, stats);
  EXPECT_TRUE(torch::equal(replayed.x, out.x));
  EXPECT_TRUE(torch::equal(replayed.indices, out.indices));
}

TEST(ModelTest, RopeFromAnOffsetRotatesOnlyThoseFeatures) {
  const auto x = torch::randn({2, 5, 3, 12}, torch::kDouble);
  const auto positions = torch::arange(5, torch::kLong) + 7;
  const auto got = Rope(4, 10000.0, /*first=*/8).apply(x, positions);
  EXPECT_TRUE(torch::equal(got.narrow(-1, 0, 8), x.narrow(-1, 0, 8)));
  EXPECT_TRUE(torch::allclose(got.narrow(-1, 8, 4),
                              Rope(4, 10000.0).apply(x.narrow(-1, 8, 4).contiguous(), positions)));
}

// RoPE's own backward (the inverse rotation of the gradient) is the gradient of the rotation as
// autograd derives it from the formula, on a non-contiguous input whose rotated features sit
// between others.
TEST(ModelTest, RopeBackwardIsTheRotationsGradient) {
  const int64_t first = 6, rope_dim = 4, half = rope_dim / 2;
  const auto x = torch::randn({2, 3, 5, 12}, torch::kDouble).requires_grad_(true);
  const auto strided = x.transpose(1, 2);  // [2, 5 positions, 3 heads, 12], not contiguous
  const auto positions = torch::arange(5, torch::kLong) + 3;
  const auto grad = torch::randn({2, 5, 3, 12}, torch::kDouble);

  const auto got = Rope(rope_dim, 10000.0, first).apply(strided, positions);
  const auto got_grad = torch::autograd::grad({got}, {x}, {grad})[0];

  // The rotation written out, differentiated by autograd.
  const auto angles = positions.to(torch::kDouble).unsqueeze(1) *
                      torch::pow(10000.0, -torch::arange(0, half, torch::kDouble) * 2.0 / rope_dim);
  const auto cos = angles.cos().view({1, 5, 1, half}), sin = angles.sin().view({1, 5, 1, half});
  const auto x1 = strided.narrow(-1, first, half);
  const auto x2 = strided.narrow(-1, first + half, half);
  const auto want =
      torch::cat({strided.narrow(-1, 0, first), x1 * cos - x2 * sin, x2 * cos + x1 * sin,
                  strided.narrow(-1, first + rope_dim, 12 - first - rope_dim)},
                 -1);
  const auto want_grad = torch::autograd::grad({want}, {x}, {grad})[0];
  EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(got_grad, want_grad, 1e-12, 1e-12));
}

// bf16 inputs (the GPU's, under autocast) at long-context positions turn by the fp32 angles: only
// the result rounds to bf16, not the positions (in bf16, 100,001 would be 99,840).
TEST(ModelTest, RopeOfBf16TurnsByExactAngles) {
  const auto x = torch::randn({1, 4, 2, 16}, torch::kDouble);
  const auto positions = torch::tensor({257, 4097, 100001, 131071}, torch::kLong);
  const auto want = Rope(16, 10000.0).apply(x, positions);
  const auto got = Rope(16, 10000.0).apply(x.to(torch::kBFloat16), positions);
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
  // bf16 rounds x, cos, sin and the result: a few units of 2^-8 of the largest magnitude.
  const double worst = (got.to(torch::kDouble) - want).abs().max().item<double>();
  EXPECT_LT(worst, 0.05 * x.abs().max().item<double>()) << worst;
}

TEST(ModelTest, IndexerLearnsOnlyFromItsLossAndTheModelOnlyFromTheLmLoss) {
  const auto config = testing::SmallConfig();
  for (const auto mode : {AttentionMode::kDense, AttentionMode::kSparse}) {
    for (const bool recompute : {false, true}) {
      ForwardOptions o = sparse(recompute, true);
      o.attention = mode;
      const TrainedOnce lm_only = run_once(config, o, /*lm=*/true, /*indexer=*/false);
      for (const auto& [name, grad] : lm_only.grads) {
        if (is_indexer(name)) {
          EXPECT_EQ(grad.abs().max().item<float>(), 0.0f) << name;
        }
      }
      const TrainedOnce kl_only = run_once(config, o, /*lm=*/false, /*indexer=*/true);
      int indexer_grads = 0;
      for (const auto& [name, grad] : kl_only.grads) {
        if (is_indexer(name)) {
          indexer_grads += grad.abs().max().item<float>() > 0;
        } else {
          EXPECT_EQ(grad.abs().max().item<float>(), 0.0f) << name;
        }
      }
      EXPECT_GT(indexer_grads, 0);
    }
  }
}

TEST(ModelTest, SparseAttentionOverEveryKeyIsDenseAttention) {
  auto config = testing::SmallConfig();
  config.topk = 19;  // the sequence length: every row selects all its visible keys
  ForwardOptions dense = sparse(false, false);
  dense.attention = AttentionMode::kDense;
  const TrainedOnce d = run_once(config, dense);
  const TrainedOnce s = run_once(config, sparse(false, false));
  EXPECT_TRUE(torch::allclose(d.logits, s.logits, 1e-4, 1e-5));
  for (const auto& [name, grad] : d.grads) {
    if (!is_indexer(name)) {
      EXPECT_TRUE(torch::allclose(grad, s.grads.at(name), 1e-3, 1e-6)) << name;
    }
  }
}

TEST(ModelTest, BackwardReportsTheIndexerLoss) {
  // A sparse step that trains forms its indexer loss in backward (the recomputation's, or the
  // attention backward's without it) and reports it once backward ran: the same rows' losses,
  // averaged in another order (a layer at a time under recomputation), so equal to fp32 rounding.
  const TrainedOnce plain = run_once(testing::SmallConfig(), sparse(false, false));
  const TrainedOnce replay = run_once(testing::SmallConfig(), sparse(true, true));
  const TrainedOnce reselect = run_once(testing::SmallConfig(), sparse(true, false));
  EXPECT_GT(plain.indexer_loss, 0);
  EXPECT_NEAR(replay.indexer_loss, plain.indexer_loss, 1e-6 * plain.indexer_loss);
  EXPECT_DOUBLE_EQ(reselect.indexer_loss, replay.indexer_loss);
}

TEST(ModelTest, WithoutRecomputationTheTargetComesFromTheAttentionBackward) {
  // No indexer-loss work in the forward: the loss's value is 0 until backward has run.
  torch::manual_seed(7);
  DsaModel model(testing::SmallConfig());
  const auto tokens = torch::randint(testing::SmallConfig().vocab_size, {2, 19}, torch::kLong);
  const auto result = model->forward(tokens, sparse(false, false));
  ASSERT_TRUE(result.indexer_loss_rows.defined());
  EXPECT_EQ(result.reported_indexer_loss().item<double>(), 0);
  result.indexer_loss.backward();
  EXPECT_GT(result.reported_indexer_loss().item<double>(), 0);
  // A forward without a backward to follow (evaluation) computes it there.
  torch::NoGradGuard no_grad;
  const auto evaluated = model->forward(tokens, sparse(false, false));
  EXPECT_FALSE(evaluated.indexer_loss_rows.defined());
  // The KL sums fp32 terms t (log t - log p) of up to log k each that nearly cancel (the loss is
  // near 0 at initialization). On the GPU the two paths sum them apart (the target from the
  // attention backward and the KL in the index scores' backward, against selected_attention_mass
  // and the KL kernel), so they agree to the terms' rounding, not the sum's (1.6e-9 on an H100).
  const double loss = result.reported_indexer_loss().item<double>();
  const double terms = std::log(static_cast<double>(testing::SmallConfig().topk));
  EXPECT_NEAR(evaluated.reported_indexer_loss().item<double>(), loss, 1e-6 * loss + 1e-8 * terms);
}

TEST(ModelTest, QueryGroupReachesTheAttentionOps) {
  // The job's G goes to the sparse attention ops: an unsupported one is refused there by name.
  ForwardOptions options = sparse(true, true);
  options.query_group = 4;
  EXPECT_NO_THROW(run_once(testing::SmallConfig(), options));
  options.query_group = 3;
  try {
    run_once(testing::SmallConfig(), options);
    ADD_FAILURE() << "G = 3 reached no op";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("group must be 0"), std::string::npos) << e.what();
  }
}

// One training step's forward and backward with the clock running, as the trainer times it.
std::map<std::string, double> timed_step(const ForwardOptions& options, double* wall_seconds) {
  torch::manual_seed(7);
  DsaModel model(testing::SmallConfig());
  const auto tokens = torch::randint(32, {2, 19}, torch::kLong);
  PhaseClock& clock = *options.clock;
  const auto start = std::chrono::steady_clock::now();
  clock.start();
  torch::Tensor loss;
  {
    const auto result = model->forward(tokens, options);
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_LM_HEAD);
    loss = torch::nn::functional::cross_entropy(result.logits.view({-1, 32}), tokens.view(-1)) +
           result.indexer_loss;
  }
  {
    PhaseClock::PassGuard pass(clock, v1::STEP_PASS_BWD);
    PhaseClock::BackwardAttribution attribution(clock);
    loss.backward();
  }
  auto phases = clock.take();
  *wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return phases;
}

TEST(PhaseClockTest, PhasesAddUpToTheStepApartByPass) {
  ForwardOptions options = sparse(true, true);
  options.clock = c10::make_intrusive<PhaseClock>();
  double wall = 0;
  const auto phases = timed_step(options, &wall);
  double sum = 0;
  for (const auto& [name, seconds] : phases) {
    sum += seconds;
    EXPECT_TRUE(IsPhaseName(name)) << name;
  }
  EXPECT_NEAR(sum, wall, 0.03 * wall);
  // The recomputation forms the indexer loss's node, a handle (indexer_loss_recompute, next to
  // nothing); the target comes out of the attention backward (attention_bwd), then the loss's
  // node forms the KL and the scores' backward (indexer_loss_bwd).
  for (const char* name :
       {"lm_head_fwd", "attn_proj_fwd", "selection_fwd", "attention_fwd", "indexer_loss_fwd",
        "mlp_fwd", "attn_proj_recompute", "selection_recompute", "attention_recompute",
        "mlp_recompute", "lm_head_bwd", "attn_proj_bwd", "attention_bwd", "indexer_loss_bwd",
        "mlp_bwd", "indexer_loss_recompute"}) {
    EXPECT_GT(phases.count(name), 0u) << name << " was not timed";
  }
}

TEST(PhaseClockTest, BackwardWorkCountsForThePhaseThatCreatedIt) {
  PhaseClock clock;
  const auto weight = torch::randn({384, 384}, torch::requires_grad());
  const auto x = torch::randn({384, 384});
  clock.start();
  torch::Tensor heavy, light;
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_MLP);
    heavy = x;
    for (int i = 0; i < 24; ++i) heavy = torch::tanh(heavy.matmul(weight));
  }
  {
    PhaseClock::Scope scope(clock, v1::STEP_PHASE_ATTENTION);
    light = heavy.sum();
  }
  {
    PhaseClock::PassGuard pass(clock, v1::STEP_PASS_BWD);
    PhaseClock::BackwardAttribution attribution(clock);
    light.backward();
  }
  const auto phases = clock.take();
  ASSERT_GT(phases.count("mlp_bwd"), 0u);
  ASSERT_GT(phases.count("attention_bwd"), 0u);
  // The matmuls' backward (24 pairs of products) against one sum's.
  EXPECT_GT(phases.at("mlp_bwd"), 5 * phases.at("attention_bwd"));
  EXPECT_GT(phases.at("mlp_bwd"), 0.5 * phases.at("mlp_fwd"));
}

}  // namespace
}  // namespace hyscale::trainer
