// The CUDA ops of the indexer's training path against float64 references on fresh random inputs:
// index_score_backward, selected_attention_mass, indexer_kl and its backward, on N not a multiple
// of any tile, topk not a multiple of 32, -1 slots, rows with t + 1 < topk (causal selections) and
// rows without a valid slot; then the whole chain (q_I, k_I, w -> index_score_gather; q, key ->
// sparse_attn -> selected_attention_mass; indexer_kl -> backward) on CUDA against the CPU ops;
// the dense warm-up's dense_indexer_kl against the CPU op.
// The deterministic mode of index_score_backward: grad_k bit-identical across runs, and within
// its documented tolerance of the float64 reference. Skips without a GPU.
#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/torch/ops.h"
#include "tests/kernels/gpu_kernel_test.h"

namespace hyscale::test {
namespace {

class IndexerLossCudaTest : public GpuKernelTest {};

// Multiples of 1/8 in [-1, 1]: exact in bf16, and every index score and dot product of them is
// exact in fp32 whatever the summation order, so the ReLU gates of the GPU and of the float64
// reference agree (a gate flipped by rounding would move a gradient by a whole term).
torch::Tensor eighths(at::IntArrayRef sizes) {
  return torch::randint(-8, 9, sizes).to(torch::kFloat) / 8;
}

torch::Tensor bf16_values(at::IntArrayRef sizes) {
  return torch::randn(sizes).to(torch::kBFloat16).to(torch::kFloat);
}

// Causal selections: row t takes up to min(topk, t + 1) distinct keys of [0, t] (some rows fewer,
// some none when allowed) in random slots, -1 elsewhere.
torch::Tensor causal_indices(Random& rng, int64_t n, int64_t topk, bool allow_empty_rows) {
  auto indices = torch::full({n, topk}, -1, torch::kInt);
  auto idx = indices.accessor<int32_t, 2>();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t most = std::min(topk, t + 1);
    int64_t valid = rng.chance(0.6) ? most : rng.uniform_int(0, most);
    if (!allow_empty_rows) valid = std::max<int64_t>(valid, 1);
    const auto keys = torch::randperm(t + 1, torch::kLong);
    const auto slots = torch::randperm(topk, torch::kLong);
    for (int64_t i = 0; i < valid; ++i) {
      idx[t][slots[i].item<int64_t>()] = static_cast<int32_t>(keys[i].item<int64_t>());
    }
  }
  return indices;
}

// max |got - want| <= tol * max(1, max |want|), with infinities matched exactly.
void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tol,
                  const std::string& what) {
  const auto g = got.cpu().to(torch::kDouble), w = want.cpu().to(torch::kDouble);
  ASSERT_EQ(g.sizes(), w.sizes()) << what;
  ASSERT_FALSE(g.isnan().any().item<bool>()) << what << ": NaN";
  ASSERT_TRUE(torch::equal(g.isinf(), w.isinf())) << what << ": infinities differ";
  const auto finite = w.isfinite();
  const double scale =
      std::max(1.0, w.masked_fill(finite.logical_not(), 0).abs().max().item<double>());
  const double worst = (g - w).abs().masked_fill(finite.logical_not(), 0).max().item<double>();
  EXPECT_LE(worst, tol * scale) << what << ": max error " << worst << " vs max |ref| " << scale;
}

// The attention's log-sum-exps [N, H] in float64 over each row's causal prefix of keys (row t
// sees key s where (s + 1) tokens_per_key - 1 <= t + q_offset).
torch::Tensor causal_lse(const torch::Tensor& q, const torch::Tensor& key, double scale,
                         int64_t q_offset, int64_t tokens_per_key) {
  const auto visible =
      torch::arange(key.size(0)).unsqueeze(0) * tokens_per_key + tokens_per_key - 1 <=
      torch::arange(q.size(0)).unsqueeze(1) + q_offset;
  return torch::logsumexp(
      (torch::einsum("thd,sd->ths", {q.to(torch::kDouble), key.to(torch::kDouble)}) * scale)
          .masked_fill(visible.logical_not().unsqueeze(1), -INFINITY),
      -1);
}

struct IndexerCase {
  int64_t n, m, heads, dim, topk;
};

std::string describe(const IndexerCase& c) {
  return "N " + std::to_string(c.n) + " M " + std::to_string(c.m) + " H_I " +
         std::to_string(c.heads) + " d_I " + std::to_string(c.dim) + " topk " +
         std::to_string(c.topk);
}

// The index scores' gradients in float64 through torch's autograd.
ops::IndexScoreGrads reference_index_score_backward(const torch::Tensor& grad,
                                                    const torch::Tensor& q, const torch::Tensor& k,
                                                    const torch::Tensor& w,
                                                    const torch::Tensor& indices) {
  auto qd = q.to(torch::kDouble).requires_grad_(true);
  auto kd = k.to(torch::kDouble).requires_grad_(true);
  auto wd = w.to(torch::kDouble).requires_grad_(true);
  const auto idx = indices.to(torch::kLong);
  const auto dots = torch::einsum("nhd,nkd->nhk", {qd, kd.index({idx.clamp_min(0)})});
  const auto scores = (wd.unsqueeze(-1) * torch::relu(dots)).sum(1);
  (scores * grad.to(torch::kDouble) * idx.ge(0)).sum().backward();
  return {qd.grad(), kd.grad(), wd.grad()};
}

// Causal selections of a case, shifted so that rows see keys [0, q_offset + t] with
// q_offset = M - N (with M > N the last rows see every key).
torch::Tensor shifted_causal_indices(Random& rng, const IndexerCase& c) {
  const auto indices = causal_indices(rng, c.n, c.topk, /*allow_empty_rows=*/true);
  return torch::where(indices.ge(0), indices + static_cast<int32_t>(c.m - c.n), indices);
}

// Random inputs of a case, on the CPU: eighths (exact in fp32 sums) and shifted causal indices.
struct IndexerInputs {
  torch::Tensor q, k, w, indices;
};

IndexerInputs eighths_inputs(Random& rng, const IndexerCase& c) {
  return {eighths({c.n, c.heads, c.dim}), eighths({c.m, c.dim}), eighths({c.n, c.heads}),
          shifted_causal_indices(rng, c)};
}

const IndexerCase kIndexerCases[] = {
    {45, 45, 16, 64, 40}, {70, 70, 64, 128, 33}, {19, 300, 32, 128, 97}};

// index_score_backward on the GPU (rows at q_offset M - N) against the float64 reference, on
// CPU inputs of eighths.
void expect_index_score_backward_matches(const IndexerCase& c, const IndexerInputs& in) {
  const auto grad = eighths({c.n, c.topk});
  const auto want = reference_index_score_backward(grad, in.q, in.k, in.w, in.indices);
  const auto got = ops::index_score_backward(grad.cuda(), in.q.cuda(), in.k.cuda(), in.w.cuda(),
                                             in.indices.cuda(), c.m - c.n);
  expect_close(got.q, want.q, 1e-6, "grad_q");
  expect_close(got.k, want.k, 1e-6, "grad_k");
  expect_close(got.w, want.w, 1e-6, "grad_w");
}

TEST_F(IndexerLossCudaTest, IndexScoreBackwardMatchesFloat64Reference) {
  for (const IndexerCase& c : kIndexerCases) {
    SCOPED_TRACE(describe(c));
    expect_index_score_backward_matches(c, eighths_inputs(rng_, c));
  }
}

// Key-ordered rows (FlashTopK's order) of several tiles spread over more keys than the L2 holds,
// and more rows than the GPU holds at once: rows start their walk of their tiles mid-row (rotated
// by their launch position) and wrap around, and each tile is still summed once. A fifth of the
// rows end in -1 slots (those start at their first tile).
TEST_F(IndexerLossCudaTest, IndexScoreBackwardOfRowsStartingMidRowMatchesFloat64Reference) {
  const IndexerCase c{3000, 200000, 64, 128, 200};
  // Row t sees keys [0, M - N + t]: one key from each of topk strata of its window, ascending.
  const auto window = torch::arange(c.m - c.n + 1, c.m + 1, torch::kLong).unsqueeze(1);
  const auto strata = torch::arange(c.topk, torch::kDouble).unsqueeze(0) +
                      torch::rand({c.n, c.topk}, torch::kDouble);
  const auto indices = (strata * window.to(torch::kDouble) / c.topk).floor().to(torch::kInt);
  const auto tails =
      torch::rand({c.n, 1}).lt(0.2).logical_and(torch::arange(c.topk).unsqueeze(0).ge(c.topk - 30));
  expect_index_score_backward_matches(c, {eighths({c.n, c.heads, c.dim}), eighths({c.m, c.dim}),
                                          eighths({c.n, c.heads}), indices.masked_fill(tails, -1)});
}

// Adjacent rows that share most of their keys, as a trained indexer's do (their key-gradient rows
// meet in grad_k's reductions), among them a row that repeats a key, a row out of key order and a
// row ending in -1 slots: every pair is added once.
TEST_F(IndexerLossCudaTest, IndexScoreBackwardOfRowsSharingKeysMatchesFloat64Reference) {
  const IndexerCase c{100, 300, 64, 128, 130};
  constexpr int64_t kPool = 150;  // keys 4 adjacent rows choose from
  std::vector<torch::Tensor> rows;
  torch::Tensor pool;
  for (int64_t t = 0; t < c.n; ++t) {
    if (t % 4 == 0) pool = torch::randperm(c.m, torch::kInt).narrow(0, 0, kPool);
    rows.push_back(std::get<0>(pool.index({torch::randperm(kPool).narrow(0, 0, c.topk)}).sort()));
  }
  auto indices = torch::stack(rows);
  indices[7][5] = indices[7][6].item<int32_t>();
  indices[10] = indices[10].flip(0);
  indices[13].narrow(0, 120, c.topk - 120).fill_(-1);
  expect_index_score_backward_matches(
      c, {eighths({c.n, c.heads, c.dim}), eighths({c.m, c.dim}), eighths({c.n, c.heads}), indices});
}

// torch.use_deterministic_algorithms(True) for a scope; the previous setting is restored.
class DeterministicAlgorithms {
 public:
  DeterministicAlgorithms()
      : was_on_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicAlgorithms() {
    at::globalContext().setDeterministicAlgorithms(was_on_, warn_only_);
  }
  DeterministicAlgorithms(const DeterministicAlgorithms&) = delete;
  DeterministicAlgorithms& operator=(const DeterministicAlgorithms&) = delete;

 private:
  bool was_on_, warn_only_;
};

// Every row selects topk distinct keys of few (M), so each key collects hundreds of rows'
// contributions; about 10 % of the slots are -1.
torch::Tensor crowded_indices(int64_t n, int64_t m, int64_t topk) {
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < n; ++t)
    rows.push_back(torch::randperm(m, torch::kInt).narrow(0, 0, topk));
  const auto indices = torch::stack(rows);
  return indices.masked_fill(torch::rand({n, topk}).lt(0.1), -1);
}

// bf16 queries (the trainer's) get a bf16 grad_q from the kernel itself: the fp32 path's grad_q
// rounded to bf16, bit for bit (a row's grad_q sums in a fixed order), with the same grad_k and
// grad_w (deterministic, so those match bit for bit too).
TEST_F(IndexerLossCudaTest, IndexScoreBackwardOfBf16QueriesIsTheFp32GradientRounded) {
  const IndexerCase c{70, 70, 64, 128, 33};
  const IndexerInputs in = eighths_inputs(rng_, c);
  const auto grad = torch::randn({c.n, c.topk}).cuda();
  const auto q = in.q.cuda(), k = in.k.cuda(), w = in.w.cuda(), indices = in.indices.cuda();
  const DeterministicAlgorithms deterministic;
  const auto from_fp32 = ops::index_score_backward(grad, q, k, w, indices, c.m - c.n);
  const auto from_bf16 =
      ops::index_score_backward(grad, q.to(torch::kBFloat16), k, w, indices, c.m - c.n);
  ASSERT_EQ(from_bf16.q.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(from_bf16.q, from_fp32.q.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(from_bf16.k, from_fp32.k) && torch::equal(from_bf16.w, from_fp32.w));
}

TEST_F(IndexerLossCudaTest, DeterministicIndexScoreBackwardIsBitIdenticalAcrossRuns) {
  const IndexerCase cases[] = {{600, 96, 64, 128, 64}, {1000, 40, 16, 64, 33}};
  for (const IndexerCase& c : cases) {
    SCOPED_TRACE(describe(c));
    // Values whose sums round in fp32, so the order of additions would show in the bits.
    const auto q = bf16_values({c.n, c.heads, c.dim}).cuda(), k = bf16_values({c.m, c.dim}).cuda();
    const auto w = torch::randn({c.n, c.heads}).cuda();
    const auto indices = crowded_indices(c.n, c.m, c.topk).cuda();
    const auto grad = torch::randn({c.n, c.topk}).cuda();
    const auto atomic = ops::index_score_backward(grad, q, k, w, indices);
    const DeterministicAlgorithms deterministic;
    const auto first = ops::index_score_backward(grad, q, k, w, indices);
    ASSERT_TRUE(first.k.ne(0).any().item<bool>()) << "grad_k is all zeros";
    for (int run = 1; run < 4; ++run) {
      const auto again = ops::index_score_backward(grad, q, k, w, indices);
      EXPECT_TRUE(torch::equal(again.k, first.k)) << "grad_k differs, run " << run;
      EXPECT_TRUE(torch::equal(again.q, first.q)) << "grad_q differs, run " << run;
      EXPECT_TRUE(torch::equal(again.w, first.w)) << "grad_w differs, run " << run;
    }
    // The same sums as the atomic mode, in another order and rounding.
    expect_close(first.k, atomic.k, 1e-5, "deterministic vs atomic grad_k");
    expect_close(first.q, atomic.q, 1e-6, "deterministic vs atomic grad_q");
    expect_close(first.w, atomic.w, 1e-6, "deterministic vs atomic grad_w");
  }
}

// docs/sparse_attn.md: with B = N max|q| max_t (G_t W_t) the fixed-point unit is 2^-e with
// 2^e = fixed_point_scale(B) (B 2^e < 2^61); grad_k[s] is within n_s 2^-(e+1) of the sum of its
// n_s fp32 contributions, plus the rounding of that sum to fp32. Eighths keep every contribution
// exact in fp32 (so that sum is the float64 reference) and the gates equal to the reference's;
// the rows' gradients spread over 2^-20 .. 2^20, so the unit is coarser than the small rows'
// contributions and the rounding to fixed point shows.
TEST_F(IndexerLossCudaTest, DeterministicIndexScoreBackwardIsWithinItsBoundOfFloat64) {
  for (const IndexerCase& c : kIndexerCases) {
    SCOPED_TRACE(describe(c));
    const auto [q, k, w, indices] = eighths_inputs(rng_, c);
    const auto grad = eighths({c.n, c.topk}) *
                      torch::pow(2.0, torch::randint(-20, 21, {c.n, 1}).to(torch::kFloat));
    const auto want = reference_index_score_backward(grad, q, k, w, indices);

    const auto valid = indices.ge(0);
    const double g_w = (grad.to(torch::kDouble).abs() * valid)
                           .sum(1)
                           .mul(w.to(torch::kDouble).abs().sum(1))
                           .max()
                           .item<double>();
    const double bound = static_cast<double>(c.n) * q.abs().max().item<double>() * g_w;
    int e = 0;
    std::frexp(bound, &e);
    // The unit 2^(e - 61), doubled: the device sums G_t W_t in fp32, which may round the bound
    // across a power of two.
    const double unit = std::ldexp(1.0, e - 60);
    const auto count = torch::bincount(indices.masked_select(valid).to(torch::kLong), {}, c.m)
                           .to(torch::kDouble)
                           .unsqueeze(1);

    const DeterministicAlgorithms deterministic;
    const auto got = ops::index_score_backward(grad.cuda(), q.cuda(), k.cuda(), w.cuda(),
                                               indices.cuda(), c.m - c.n);
    const auto err = (got.k.cpu().to(torch::kDouble) - want.k).abs();
    const auto tol = count * unit / 2 + want.k.abs() * std::ldexp(1.0, -23);
    EXPECT_TRUE(err.le(tol).all().item<bool>())
        << "max error over tolerance " << (err / tol).max().item<double>() << " (unit 2^" << e - 60
        << ")";
    expect_close(got.q, want.q, 1e-6, "grad_q");
    expect_close(got.w, want.w, 1e-6, "grad_w");
  }
}

struct AttnCase {
  int64_t n, m, heads, dqk, topk;
  double scale;
};

TEST_F(IndexerLossCudaTest, SelectedAttentionMassMatchesFloat64Reference) {
  const AttnCase cases[] = {
      {37, 37, 5, 64, 24, 0.125},        // H below one block of heads
      {53, 200, 40, 128, 45, 0.09},      // H not a multiple of 32, topk not of 32
      {80, 2500, 128, 576, 70, 0.0417},  // DeepSeek-V3.2 absorbed d_qk, four blocks of heads
  };
  for (const AttnCase& c : cases) {
    SCOPED_TRACE("N " + std::to_string(c.n) + " H " + std::to_string(c.heads) + " d_qk " +
                 std::to_string(c.dqk));
    const auto q = bf16_values({c.n, c.heads, c.dqk}), key = bf16_values({c.m, c.dqk});
    auto indices = causal_indices(rng_, c.n, c.topk, /*allow_empty_rows=*/true);
    const int32_t shift = static_cast<int32_t>(c.m - c.n);
    indices = torch::where(indices.ge(0), indices + shift, indices);

    const auto idx = indices.to(torch::kLong);
    const auto valid = idx.ge(0);
    const auto logits =
        (torch::einsum("nhd,nkd->nhk",
                       {q.to(torch::kDouble), key.to(torch::kDouble).index({idx.clamp_min(0)})}) *
         c.scale)
            .masked_fill(valid.logical_not().unsqueeze(1), -INFINITY);
    const auto lse = torch::logsumexp(logits, -1);  // -inf for rows without a valid slot
    const auto finite_lse = torch::where(lse.isinf(), torch::zeros_like(lse), lse);
    const auto summed = torch::exp(logits - finite_lse.unsqueeze(-1)).sum(1);  // [N, topk]
    const auto total = summed.sum(-1, true);
    const auto want = torch::where(total.gt(0), summed / total, torch::zeros_like(summed));

    const auto got = ops::selected_attention_mass(q.cuda(), key.cuda(), indices.cuda(),
                                                  lse.to(torch::kFloat).cuda(), c.scale);
    ASSERT_EQ(got.scalar_type(), torch::kFloat);
    expect_close(got, want, 1e-5, "mass");
    EXPECT_TRUE(torch::equal(got.cpu().eq(0).logical_or(valid), torch::ones_like(valid)))
        << "a -1 slot got mass";
  }
}

// Scores with -inf slots (and rows of them only), targets normalised over the valid slots with
// some zeros.
struct KlInputs {
  torch::Tensor score, target, grad_loss;
};

KlInputs kl_inputs(int64_t rows, int64_t topk) {
  auto score = torch::randn({rows, topk}) * 3;
  auto invalid = torch::rand({rows, topk}).lt(0.2);
  invalid.index_put_({rows / 2}, true);  // a row without a valid slot
  score = score.masked_fill(invalid, -INFINITY);
  auto target = torch::rand({rows, topk}).masked_fill(invalid, 0);
  target = target.masked_fill(torch::rand({rows, topk}).lt(0.1), 0);
  const auto total = target.sum(-1, true);
  target = torch::where(total.gt(0), target / total, torch::zeros_like(target));
  return {score, target, torch::randn({rows})};
}

TEST_F(IndexerLossCudaTest, IndexerKlMatchesFloat64Reference) {
  for (const auto& [rows, topk] : {std::pair<int64_t, int64_t>{77, 300}, {5, 2048}, {33, 1}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " topk " + std::to_string(topk));
    const KlInputs in = kl_inputs(rows, topk);
    // The CPU op in float64 is the reference (kernels/cpu/indexer_kl.cc, tested on its own).
    const auto want_loss =
        ops::indexer_kl(in.score.to(torch::kDouble), in.target.to(torch::kDouble));
    const auto want_grad = ops::indexer_kl_backward(
        in.grad_loss.to(torch::kDouble), in.score.to(torch::kDouble), in.target.to(torch::kDouble));
    const auto loss = ops::indexer_kl(in.score.cuda(), in.target.cuda());
    const auto grad =
        ops::indexer_kl_backward(in.grad_loss.cuda(), in.score.cuda(), in.target.cuda());
    ASSERT_EQ(loss.scalar_type(), torch::kFloat);
    expect_close(loss, want_loss, 1e-5, "loss");
    expect_close(grad, want_grad, 1e-5, "grad_score");
    EXPECT_EQ(loss.cpu()[rows / 2].item<float>(), 0.f) << "row without a valid slot";
  }
}

// The sparse stage's indexer loss as the model computes it, on CUDA and on the CPU (fp32), with
// the same inputs: gradients of q_I, k_I and w must agree.
TEST_F(IndexerLossCudaTest, IndexerLossChainOnCudaMatchesTheCpuOps) {
  const int64_t n = 150, topk = 40, heads_i = 16, dim_i = 64, heads = 8, dqk = 64;
  const double scale = 0.125;
  const auto q_i = eighths({n, heads_i, dim_i}), k_i = eighths({n, dim_i});
  const auto w = eighths({n, heads_i});
  const auto q = bf16_values({n, heads, dqk}), key = bf16_values({n, dqk});
  const auto value = bf16_values({n, dqk});
  const auto indices = causal_indices(rng_, n, topk, /*allow_empty_rows=*/false);

  struct Result {
    torch::Tensor loss, target, grad_q, grad_k, grad_w;
  };
  auto run = [&](const torch::Device& device) {
    auto qi = q_i.to(device).requires_grad_(true), ki = k_i.to(device).requires_grad_(true);
    auto wi = w.to(device).requires_grad_(true);
    const auto idx = indices.to(device);
    const auto score = ops::index_score_gather(qi, ki, wi, idx);
    const auto attn = ops::sparse_attn(q.to(device), key.to(device), value.to(device), idx, scale);
    const auto target =
        ops::selected_attention_mass(q.to(device), key.to(device), idx, attn.lse, scale);
    const auto loss = ops::indexer_kl(score, target).mean();
    loss.backward();
    return Result{loss.cpu(), target.cpu(), qi.grad().cpu(), ki.grad().cpu(), wi.grad().cpu()};
  };
  const Result gpu = run(torch::kCUDA), cpu = run(torch::kCPU);
  // The targets differ by the GPU attention's bf16 lse; the scores are exact on both.
  expect_close(gpu.target, cpu.target, 1e-4, "target");
  expect_close(gpu.loss, cpu.loss, 1e-4, "loss");
  expect_close(gpu.grad_q, cpu.grad_q, 1e-4, "grad q_I");
  expect_close(gpu.grad_k, cpu.grad_k, 1e-4, "grad k_I");
  expect_close(gpu.grad_w, cpu.grad_w, 1e-4, "grad w");
}

// indexer_loss_backward (the KL under the selection's normalizer with the scores' backward, as the
// trainer's attention backward calls it) on CUDA against the float64 CPU op on the same inputs:
// eighths (exact scores, so the gates agree), causal rows with -1 slots and rows without a valid
// slot, bf16 queries as the trainer's.
TEST_F(IndexerLossCudaTest, IndexerLossBackwardOnCudaMatchesTheFloat64CpuOp) {
  const int64_t n = 333, topk = 77, heads_i = 64, dim_i = 128;
  const auto q_i = eighths({n, heads_i, dim_i}), k_i = eighths({n, dim_i});
  const auto w = eighths({n, heads_i});
  const auto indices = causal_indices(rng_, n, topk, /*allow_empty_rows=*/true);
  const auto valid = indices.ge(0);
  auto target = torch::rand({n, topk}, torch::kDouble).masked_fill(valid.logical_not(), 0);
  target = target / target.sum(-1, true).clamp_min(1e-300);
  const auto grad_loss = torch::randn({n}, torch::kDouble);
  const auto score_lse = ops::index_score_gather(q_i, k_i, w, indices).logsumexp(-1);
  const auto want = ops::indexer_loss_backward(target, score_lse, grad_loss, q_i, k_i, w, indices);
  const auto got = ops::indexer_loss_backward(
      target.to(torch::kCUDA, torch::kFloat), score_lse.to(torch::kCUDA, torch::kFloat),
      grad_loss.to(torch::kCUDA, torch::kFloat), q_i.to(torch::kCUDA, torch::kBFloat16),
      k_i.to(torch::kCUDA, torch::kBFloat16), w.to(torch::kCUDA, torch::kFloat),
      indices.to(torch::kCUDA));
  expect_close(got.loss.cpu().to(torch::kDouble), want.loss, 1e-5, "loss");
  expect_close(got.q.cpu().to(torch::kDouble), want.q, 1e-2, "grad q_I (bf16)");
  expect_close(got.k.cpu().to(torch::kDouble), want.k, 3e-3, "grad k_I");
  expect_close(got.w.cpu().to(torch::kDouble), want.w, 3e-3, "grad w");
  // Deterministic: the same bits on a second run.
  const DeterministicAlgorithms deterministic;
  const auto run = [&] {
    return ops::indexer_loss_backward(
        target.to(torch::kCUDA, torch::kFloat), score_lse.to(torch::kCUDA, torch::kFloat),
        grad_loss.to(torch::kCUDA, torch::kFloat), q_i.to(torch::kCUDA, torch::kBFloat16),
        k_i.to(torch::kCUDA, torch::kBFloat16), w.to(torch::kCUDA, torch::kFloat),
        indices.to(torch::kCUDA));
  };
  const auto first = run(), second = run();
  EXPECT_TRUE(torch::equal(first.k, second.k)) << "deterministic grad k_I differs between runs";
  expect_close(first.k.cpu().to(torch::kDouble), want.k, 3e-3, "deterministic grad k_I");
}

// The key-gradient kernel dense_indexer_kl takes on the GPU, forced while in scope: "share" (a
// row's q serves three 64-key tiles), "split" (a tile's rows split three ways), or nullptr (the
// op's choice by the block's shape: at test sizes, "split").
class DenseKeyGradForm {
 public:
  // form: "share", "split", or null for the op's own choice (whatever the caller had set).
  explicit DenseKeyGradForm(const char* form) {
    if (const char* before = std::getenv(kVariable)) before_ = before;
    if (form) {
      setenv(kVariable, form, 1);
    } else {
      unsetenv(kVariable);
    }
  }
  ~DenseKeyGradForm() {
    if (before_) {
      setenv(kVariable, before_->c_str(), 1);
    } else {
      unsetenv(kVariable);
    }
  }

 private:
  static constexpr const char* kVariable = "HYSCALE_DENSE_KEY_GRAD";
  std::optional<std::string> before_;
};
constexpr const char* kDenseKeyGradForms[] = {nullptr, "share", "split"};

std::string form_name(const char* form) {
  return form ? form : "the op's choice";
}

// The dense warm-up's loss (dense_indexer_kl) on CUDA against the CPU op in float64 on the same
// values: exact in bf16 (attention) and eighths (indexer, so the ReLU gates agree); N not a
// multiple of any tile, q_offset > 0 (a context-parallel shard), tokens_per_key 2 (rows that see no
// key), H_I and d_I at each end of what the kernels take; blocks of three rows (the rows kernel's)
// cut short at N and straddling a tile's end (rows 63 .. 65 at q_offset 0), blocks of three key
// tiles cut short at M, under each key-gradient kernel. The GPU's error is the bf16 coefficients
// of the index-score backward and fp32 sums.
TEST_F(IndexerLossCudaTest, DenseIndexerKlMatchesTheFloat64CpuOp) {
  struct DenseCase {
    int64_t n, m, heads, dim_qk, index_heads, index_dim, q_offset, tokens_per_key;
  };
  // With the lse given, H in {8, .., 128} and d_qk a multiple of 64 take the fused target (the
  // rest, and every case without the lse, the logits'). Its two consumers take alternate 64-key
  // tiles of a 2048-key chunk: odd counts of tiles (7 at H = 64, 3 at H = 32 and H = 16), an even
  // one (4 at H = 128), the last tile partly past the rows' prefixes, and a second chunk of 3
  // tiles with a last block of pairs part empty (2202 rows, 4 a block at H = 32). The last case
  // spans two blocks of rows (at most 4096 a block): the key-major gradient adds each block's
  // part into grad_k.
  const DenseCase cases[] = {
      {300, 300, 8, 72, 16, 64, 0, 1},     {250, 400, 64, 576, 64, 128, 150, 1},
      {131, 70, 4, 64, 32, 128, 9, 2},     {200, 260, 128, 128, 16, 64, 40, 1},
      {333, 333, 32, 192, 64, 128, 0, 2},  {150, 150, 16, 64, 32, 64, 7, 1},
      {2202, 2202, 32, 128, 16, 64, 5, 1}, {4500, 4500, 8, 64, 16, 64, 3, 1}};
  for (const DenseCase& c : cases) {
    SCOPED_TRACE("N " + std::to_string(c.n) + " M " + std::to_string(c.m) + " H " +
                 std::to_string(c.heads) + " d_qk " + std::to_string(c.dim_qk) + " H_I " +
                 std::to_string(c.index_heads) + " d_I " + std::to_string(c.index_dim) +
                 " q_offset " + std::to_string(c.q_offset) + " tokens_per_key " +
                 std::to_string(c.tokens_per_key));
    const auto q = bf16_values({c.n, c.heads, c.dim_qk}), key = bf16_values({c.m, c.dim_qk});
    const auto q_i = eighths({c.n, c.index_heads, c.index_dim});
    const auto k_i = eighths({c.m, c.index_dim}), w = eighths({c.n, c.index_heads});
    const double scale = 1 / std::sqrt(static_cast<double>(c.dim_qk));
    auto run = [&](const torch::Device& device, torch::Dtype dtype) {
      const auto on = [&](const torch::Tensor& t) { return t.to(device, dtype); };
      return ops::dense_indexer_kl(on(q), on(key), on(q_i), on(k_i), on(w), scale, c.q_offset,
                                   c.tokens_per_key);
    };
    const auto want = run(torch::kCPU, torch::kDouble);
    ASSERT_TRUE(want.grad_k.ne(0).any().item<bool>()) << "grad_k is all zeros";
    for (const char* form : kDenseKeyGradForms) {
      SCOPED_TRACE("key gradient: " + form_name(form));
      const DenseKeyGradForm forced(form);
      const auto gpu = run(torch::kCUDA, torch::kFloat);
      expect_close(gpu.loss, want.loss, 1e-4, "loss");
      expect_close(gpu.grad_q, want.grad_q, 1e-2, "grad q_I");
      expect_close(gpu.grad_k, want.grad_k, 1e-2, "grad k_I");
      expect_close(gpu.grad_w, want.grad_w, 1e-2, "grad w");
    }
    // With the attention's log-sum-exps given (as the trainer passes its forward's): the same.
    const auto lse = causal_lse(q, key, scale, c.q_offset, c.tokens_per_key);
    const auto given =
        ops::dense_indexer_kl(q.cuda(), key.cuda(), q_i.cuda(), k_i.cuda(), w.cuda(), scale,
                              c.q_offset, c.tokens_per_key, lse.to(torch::kFloat).cuda());
    expect_close(given.loss, want.loss, 1e-4, "loss, lse given");
    expect_close(given.grad_q, want.grad_q, 1e-2, "grad q_I, lse given");
    expect_close(given.grad_k, want.grad_k, 1e-2, "grad k_I, lse given");
    expect_close(given.grad_w, want.grad_w, 1e-2, "grad w, lse given");
  }
}

// Without the lse, dense_indexer_kl makes it by the fused target's tiles (dense_lse_kernel) for the
// shapes they take: the same loss and gradients as with the float64 lse given, over more than one
// 2048-key chunk (the chunks' partials merged), rows that see no key (tokens_per_key 2), a row
// block's last pairs past N, and H at both ends of what the tiles take.
TEST_F(IndexerLossCudaTest, DenseIndexerKlMakesTheLseItIsNotGiven) {
  struct LseCase {
    int64_t n, heads, dim_qk, q_offset, tokens_per_key;
  };
  for (const LseCase& c :
       {LseCase{2500, 64, 576, 0, 1}, LseCase{301, 8, 64, 0, 2}, LseCase{130, 128, 128, 2100, 1}}) {
    SCOPED_TRACE("N " + std::to_string(c.n) + " H " + std::to_string(c.heads) + " d_qk " +
                 std::to_string(c.dim_qk) + " q_offset " + std::to_string(c.q_offset) +
                 " tokens_per_key " + std::to_string(c.tokens_per_key));
    const int64_t m = (c.n + c.q_offset) / c.tokens_per_key;
    const auto q = bf16_values({c.n, c.heads, c.dim_qk}), key = bf16_values({m, c.dim_qk});
    const auto q_i = eighths({c.n, 32, 64}), k_i = eighths({m, 64}), w = eighths({c.n, 32});
    const double scale = 1 / std::sqrt(static_cast<double>(c.dim_qk));
    const auto lse = causal_lse(q, key, scale, c.q_offset, c.tokens_per_key);
    const auto given =
        ops::dense_indexer_kl(q.cuda(), key.cuda(), q_i.cuda(), k_i.cuda(), w.cuda(), scale,
                              c.q_offset, c.tokens_per_key, lse.to(torch::kFloat).cuda());
    const auto made = ops::dense_indexer_kl(q.cuda(), key.cuda(), q_i.cuda(), k_i.cuda(), w.cuda(),
                                            scale, c.q_offset, c.tokens_per_key);
    // The loss (fp32 sums) holds the lse made to the given one's fp32 rounding. The gradients go
    // through bf16 (the KL's gradient as the products' coefficients, grad q_I as the output), whose
    // rounding such a difference flips by an ulp here and there: up to 3.2e-4 of the largest.
    expect_close(made.loss, given.loss, 1e-5, "loss");
    expect_close(made.grad_q, given.grad_q, 2e-3, "grad q_I");
    expect_close(made.grad_k, given.grad_k, 2e-3, "grad k_I");
    expect_close(made.grad_w, given.grad_w, 2e-3, "grad w");
  }
}

// A sequence long enough that the GPU op works in blocks of rows (up to 4096 for the tables, whole
// waves of the index-score backward; 256 for the logits at 16K keys and H = 64): rows near the
// edges of blocks and sub-blocks, each against the CPU op in float64 on those rows alone
// (q_offset places them).
TEST_F(IndexerLossCudaTest, DenseIndexerKlInBlocksMatchesTheCpuOpRowByRow) {
  const int64_t n = 16384, heads = 64, dim_qk = 64, index_heads = 16, index_dim = 64;
  const auto q = bf16_values({n, heads, dim_qk}), key = bf16_values({n, dim_qk});
  const auto q_i = eighths({n, index_heads, index_dim}), k_i = eighths({n, index_dim});
  const auto w = eighths({n, index_heads});
  const double scale = 0.125;
  const auto gpu =
      ops::dense_indexer_kl(q.cuda(), key.cuda(), q_i.cuda(), k_i.cuda(), w.cuda(), scale);
  for (const int64_t first :
       {int64_t(0), int64_t(255), int64_t(4095), int64_t(4096), int64_t(8191), n - 3}) {
    SCOPED_TRACE("rows from " + std::to_string(first));
    const int64_t rows = std::min<int64_t>(3, n - first);
    const auto mine = [&](const torch::Tensor& t) {
      return t.narrow(0, first, rows).to(torch::kDouble);
    };
    const auto want = ops::dense_indexer_kl(mine(q), key.to(torch::kDouble), mine(q_i),
                                            k_i.to(torch::kDouble), mine(w), scale, first);
    expect_close(gpu.loss.narrow(0, first, rows), want.loss, 1e-4, "loss");
    expect_close(gpu.grad_q.narrow(0, first, rows), want.grad_q, 1e-2, "grad q_I");
    expect_close(gpu.grad_w.narrow(0, first, rows), want.grad_w, 1e-2, "grad w");
  }
}

// H = 8 (16 rows a block of the fused target) and H = 128 (one row a block, its heads all of a
// consumer's columns).
TEST_F(IndexerLossCudaTest, DeterministicDenseIndexerKlIsBitIdenticalAcrossRuns) {
  for (const int64_t heads : {8, 128}) {
    SCOPED_TRACE("H " + std::to_string(heads));
    const int64_t n = 400, dim_qk = 64, index_heads = 64, index_dim = 128;
    const auto q = bf16_values({n, heads, dim_qk}).cuda(), key = bf16_values({n, dim_qk}).cuda();
    const auto q_i = bf16_values({n, index_heads, index_dim}).cuda();
    const auto k_i = bf16_values({n, index_dim}).cuda(), w = torch::randn({n, index_heads}).cuda();
    const DeterministicAlgorithms deterministic;
    // Without the lse (the logits' target) and with it (the fused target).
    const auto causal = torch::arange(n).unsqueeze(0) > torch::arange(n).unsqueeze(1);
    const auto lse = torch::logsumexp(torch::einsum("thd,sd->ths", {q, key})
                                          .mul(0.125)
                                          .masked_fill(causal.cuda().unsqueeze(1), -INFINITY),
                                      -1);
    // Each key-gradient kernel on its own (they add a tile's rows in different orders).
    for (const char* form : kDenseKeyGradForms) {
      SCOPED_TRACE("key gradient: " + form_name(form));
      const DenseKeyGradForm forced(form);
      for (const torch::Tensor& given : {torch::Tensor(), lse}) {
        SCOPED_TRACE(given.defined() ? "lse given" : "no lse");
        const auto first = ops::dense_indexer_kl(q, key, q_i, k_i, w, 0.125, 0, 1, given);
        for (int run = 1; run < 3; ++run) {
          const auto again = ops::dense_indexer_kl(q, key, q_i, k_i, w, 0.125, 0, 1, given);
          EXPECT_TRUE(torch::equal(again.loss, first.loss)) << "loss differs, run " << run;
          EXPECT_TRUE(torch::equal(again.grad_k, first.grad_k)) << "grad_k differs, run " << run;
          EXPECT_TRUE(torch::equal(again.grad_q, first.grad_q)) << "grad_q differs, run " << run;
          EXPECT_TRUE(torch::equal(again.grad_w, first.grad_w)) << "grad_w differs, run " << run;
        }
      }
    }
  }
}

TEST_F(IndexerLossCudaTest, RejectsUnsupportedShapes) {
  const auto opts = torch::TensorOptions(torch::kCUDA);
  const auto q = torch::randn({4, 2, 70}, opts), key = torch::randn({8, 70}, opts);
  const auto idx = torch::zeros({4, 3}, opts.dtype(torch::kInt));
  try {
    ops::selected_attention_mass(q, key, idx, torch::zeros({4, 3}, opts), 1.0);
    FAIL() << "lse of shape [4, 3] accepted for H = 2";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lse"), std::string::npos) << e.what();
  }
  const auto qi = torch::randn({4, 8, 64}, opts), ki = torch::randn({8, 64}, opts);
  const auto wi = torch::randn({4, 8}, opts);
  try {
    ops::index_score_backward(torch::zeros({4, 3}, opts), qi, ki, wi, idx);
    FAIL() << "H_I = 8 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_I"), std::string::npos) << e.what();
  }
  try {
    ops::dense_indexer_kl_row_multiple(qi);
    FAIL() << "H_I = 8 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_I"), std::string::npos) << e.what();
  }
}

// The rows the trainer rounds the warm-up's chunks to: whole waves of the query-major kernel's
// blocks of three rows (at least one block on every SM, so at least a few hundred rows on a
// Hopper GPU).
TEST_F(IndexerLossCudaTest, DenseIndexerKlRowMultipleIsAWaveOfRowBlocks) {
  for (const auto& [heads, dim] : {std::pair{64, 128}, std::pair{16, 64}}) {
    const int64_t rows = ops::dense_indexer_kl_row_multiple(
        torch::empty({heads, dim}, torch::TensorOptions(torch::kCUDA)));
    EXPECT_EQ(rows % 3, 0) << "H_I " << heads << ", d_I " << dim << ": " << rows;
    EXPECT_GE(rows, 3 * 100) << "H_I " << heads << ", d_I " << dim;
  }
}

}  // namespace
}  // namespace hyscale::test
