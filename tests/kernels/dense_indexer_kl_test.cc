// dense_indexer_kl (kernels and op) against the model's dense path written the naive way in float64
// torch: full [H, N, M] probabilities and [N, M] score tables, the target summed over heads and
// divided by H, autograd for the indexer's gradients. Odd shapes, q_offset, tokens_per_key > 1
// (rows that see no key), ties, all-negative weights; finite differences; thread-count
// independence.
#include "kernels/dense_indexer_kl.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/torch/ops.h"
#include "tests/kernels/op_errors.h"

namespace hyscale {
namespace {

struct Problem {
  torch::Tensor q, key, q_I, k_I, w;  // [N, H, d_qk], [M, d_qk], [N, H_I, d_I], [M, d_I], [N, H_I]
  double scale = 1;
  int64_t q_offset = 0, tokens_per_key = 1;
};

struct Dims {
  int64_t n, m, heads, dim_qk, index_heads, index_dim, q_offset, tokens_per_key;
};

std::string describe(const Dims& d) {
  return "N=" + std::to_string(d.n) + " M=" + std::to_string(d.m) +
         " H=" + std::to_string(d.heads) + " d_qk=" + std::to_string(d.dim_qk) +
         " H_I=" + std::to_string(d.index_heads) + " d_I=" + std::to_string(d.index_dim) +
         " q_offset=" + std::to_string(d.q_offset) +
         " tokens_per_key=" + std::to_string(d.tokens_per_key);
}

enum class Inputs { kGaussian, kNegativeWeights, kIntegers };

Problem make_problem(const Dims& d, Inputs inputs, std::vector<int64_t> batch = {}) {
  const auto sizes = [&batch](std::vector<int64_t> s) {
    s.insert(s.begin(), batch.begin(), batch.end());
    return s;
  };
  // Small integers: equal scores and logits (ties), exact in float too; ReLU sees exact zeros.
  const auto draw = [inputs](std::vector<int64_t> s) {
    return inputs == Inputs::kIntegers ? torch::randint(-2, 3, s, torch::kDouble)
                                       : torch::randn(s, torch::kDouble);
  };
  Problem p;
  p.q = draw(sizes({d.n, d.heads, d.dim_qk}));
  p.key = draw(sizes({d.m, d.dim_qk}));
  p.q_I = draw(sizes({d.n, d.index_heads, d.index_dim}));
  p.k_I = draw(sizes({d.m, d.index_dim}));
  p.w = draw(sizes({d.n, d.index_heads}));
  if (inputs == Inputs::kNegativeWeights) p.w = -p.w.abs();
  p.scale = 1 / std::sqrt(static_cast<double>(d.dim_qk));
  p.q_offset = d.q_offset;
  p.tokens_per_key = d.tokens_per_key;
  return p;
}

// Key s covers tokens [s*m, s*m + m) and is visible to the query at global position t when
// s*m + m - 1 <= t (DESIGN.md section 2).
torch::Tensor visible_mask(int64_t n, int64_t num_keys, int64_t q_offset, int64_t m) {
  const auto t = torch::arange(n, torch::kLong).unsqueeze(1) + q_offset;
  const auto s = torch::arange(num_keys, torch::kLong).unsqueeze(0);
  return s * m + m - 1 <= t;
}

struct Result {
  torch::Tensor loss, grad_q, grad_k, grad_w;
};

// One sequence, as the model's dense path computes it (dense_attention, dense_kl), in float64.
// Rows that see no key are masked with a finite value so that they stay out of the gradients.
Result reference(const Problem& p) {
  const auto q_I = p.q_I.detach().requires_grad_(true);
  const auto k_I = p.k_I.detach().requires_grad_(true);
  const auto w = p.w.detach().requires_grad_(true);
  const auto visible = visible_mask(p.q.size(0), p.key.size(0), p.q_offset, p.tokens_per_key);
  const auto hidden = visible.logical_not().logical_and(visible.any(-1, true));
  const auto logits = torch::einsum("thd,sd->hts", {p.q, p.key}) * p.scale;
  const auto probs = torch::softmax(logits.masked_fill(hidden, -INFINITY), -1);
  const auto target = torch::where(visible, probs, torch::zeros_like(probs)).sum(0) / p.q.size(1);
  const auto per_head = torch::relu(torch::einsum("tjd,sd->tjs", {q_I, k_I}));
  const auto scores = (per_head * w.unsqueeze(-1)).sum(1);
  const auto log_q = torch::log_softmax(scores.masked_fill(hidden, -INFINITY), -1);
  const auto masked_log_q = torch::where(visible, log_q, torch::zeros_like(log_q));
  const auto loss = (torch::xlogy(target, target) - target * masked_log_q).sum(-1);
  loss.sum().backward();
  return {loss.detach(), q_I.grad(), k_I.grad(), w.grad()};
}

// |got - want| <= tol * (1 + max |want|), naming the tensor.
void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double bound = tol * (1 + want.abs().max().item<double>());
  const double error = (got.to(torch::kDouble) - want).abs().max().item<double>();
  EXPECT_LE(error, bound) << what;
}

void expect_matches(const Result& got, const Result& want, double tol, const std::string& what) {
  expect_close(got.loss, want.loss, tol, what + ": loss");
  expect_close(got.grad_q, want.grad_q, tol, what + ": grad_q_I");
  expect_close(got.grad_k, want.grad_k, tol, what + ": grad_k_I");
  expect_close(got.grad_w, want.grad_w, tol, what + ": grad_w");
}

Result run_op(const Problem& p, torch::Dtype dtype = torch::kDouble) {
  const auto d =
      ops::dense_indexer_kl(p.q.to(dtype), p.key.to(dtype), p.q_I.to(dtype), p.k_I.to(dtype),
                            p.w.to(dtype), p.scale, p.q_offset, p.tokens_per_key);
  return {d.loss, d.grad_q, d.grad_k, d.grad_w};
}

Problem rounded_to_float(const Problem& p) {
  const auto r = [](const torch::Tensor& t) { return t.to(torch::kFloat).to(torch::kDouble); };
  Problem f = p;
  f.q = r(p.q), f.key = r(p.key), f.q_I = r(p.q_I), f.k_I = r(p.k_I), f.w = r(p.w);
  f.scale = static_cast<float>(p.scale);
  return f;
}

class DenseIndexerKlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto seed = std::random_device{}();
    torch::manual_seed(seed);
    RecordProperty("seed", static_cast<int>(seed));
    trace_ = std::make_unique<::testing::ScopedTrace>(__FILE__, __LINE__,
                                                      "seed " + std::to_string(seed));
  }

 private:
  std::unique_ptr<::testing::ScopedTrace> trace_;
};

// N not a multiple of the 16-key tiles or 8-row chunks, odd H, d not a power of two; M = N +
// q_offset (a context-parallel shard); tokens_per_key > 1 with rows that see no key and keys no row
// sees.
const std::vector<Dims> kShapes = {
    {37, 37, 3, 13, 5, 7, 0, 1}, {1, 1, 1, 1, 1, 1, 0, 1},    {21, 50, 1, 9, 3, 12, 29, 1},
    {40, 16, 5, 6, 2, 11, 0, 3}, {19, 14, 2, 17, 4, 5, 5, 2}, {33, 80, 7, 20, 1, 3, 47, 1},
    {17, 40, 3, 8, 3, 8, 0, 1},
};

TEST_F(DenseIndexerKlTest, MatchesTheDenseReference) {
  for (const Dims& d : kShapes) {
    for (const Inputs inputs : {Inputs::kGaussian, Inputs::kNegativeWeights, Inputs::kIntegers}) {
      const std::string what = describe(d) + " inputs " + std::to_string(static_cast<int>(inputs));
      const Problem p = make_problem(d, inputs);
      expect_matches(run_op(p), reference(p), 1e-10, what + " (double)");
      expect_matches(run_op(p, torch::kFloat), reference(rounded_to_float(p)), 1e-4,
                     what + " (float)");
    }
  }
}

// A row that sees one key puts all its mass there (p = softmax = 1 exactly): loss 0 and zero
// gradient; a row that sees none has loss 0 and zero gradient by definition, and a key no row sees
// gets no gradient.
TEST_F(DenseIndexerKlTest, RowsWithOneKeyOrNoneHaveZeroLossAndGradient) {
  // tokens_per_key 3: rows 0-1 see no key, rows 2-4 key 0 only, rows 5-7 keys 0-1; key 2 unseen.
  const Problem p = make_problem({8, 3, 2, 5, 3, 4, 0, 3}, Inputs::kGaussian);
  const Result r = run_op(p);
  for (int64_t t = 0; t < 5; ++t) {
    EXPECT_EQ(r.loss[t].item<double>(), 0) << "row " << t;
    EXPECT_EQ(r.grad_q[t].abs().max().item<double>(), 0) << "row " << t;
    EXPECT_EQ(r.grad_w[t].abs().max().item<double>(), 0) << "row " << t;
  }
  EXPECT_GT(r.loss[5].item<double>(), 0);
  EXPECT_EQ(r.grad_k[2].abs().max().item<double>(), 0);
}

TEST_F(DenseIndexerKlTest, BatchedIsEachSequenceOnItsOwn) {
  const Dims d{23, 30, 3, 10, 2, 6, 7, 1};
  const Problem batch = make_problem(d, Inputs::kGaussian, {3});
  const Result all = run_op(batch);
  for (int64_t b = 0; b < 3; ++b) {
    Problem one = batch;
    one.q = batch.q[b], one.key = batch.key[b], one.q_I = batch.q_I[b], one.k_I = batch.k_I[b];
    one.w = batch.w[b];
    const Result want = run_op(one);
    EXPECT_TRUE(all.loss[b].equal(want.loss)) << "sequence " << b;
    EXPECT_TRUE(all.grad_q[b].equal(want.grad_q)) << "sequence " << b;
    EXPECT_TRUE(all.grad_k[b].equal(want.grad_k)) << "sequence " << b;
    EXPECT_TRUE(all.grad_w[b].equal(want.grad_w)) << "sequence " << b;
  }
}

// The op's gradients are those of sum(loss): central differences of the op's own loss.
TEST_F(DenseIndexerKlTest, GradientsMatchFiniteDifferences) {
  const Problem p = make_problem({11, 14, 3, 6, 2, 5, 3, 1}, Inputs::kGaussian);
  const Result r = run_op(p);
  const double h = 1e-6;
  const std::vector<std::pair<torch::Tensor, torch::Tensor>> inputs = {
      {p.q_I, r.grad_q}, {p.k_I, r.grad_k}, {p.w, r.grad_w}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto flat = inputs[i].first.view(-1);  // perturbs p's tensor in place
    const auto analytic = inputs[i].second.reshape(-1);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double saved = flat[e].item<double>();
      flat[e] = saved + h;
      const double up = run_op(p).loss.sum().item<double>();
      flat[e] = saved - h;
      const double down = run_op(p).loss.sum().item<double>();
      flat[e] = saved;
      const double numeric = (up - down) / (2 * h);
      ASSERT_NEAR(analytic[e].item<double>(), numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << "input " << i << " element " << e;
    }
  }
}

// Every kernel output, computed with `threads` threads in float.
std::vector<torch::Tensor> run_kernels(const Problem& p, int threads) {
  DenseIndexerShape s;
  s.indexer.num_queries = p.q.size(0);
  s.indexer.num_keys = p.key.size(0);
  s.indexer.heads = p.q_I.size(1);
  s.indexer.dim = p.q_I.size(2);
  s.indexer.q_offset = p.q_offset;
  s.indexer.visibility.tokens_per_key = p.tokens_per_key;
  s.heads = p.q.size(1);
  s.dim_qk = p.q.size(2);
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat).contiguous(); };
  const auto q = f(p.q), key = f(p.key), q_I = f(p.q_I), k_I = f(p.k_I), w = f(p.w);
  const int64_t n = s.indexer.num_queries;
  auto lse = torch::empty({n, s.heads}), index_lse = torch::empty({n}), loss = torch::empty({n});
  auto gq = torch::empty_like(q_I), gk = torch::empty_like(k_I), gw = torch::empty_like(w);
  const CpuContext ctx{threads};
  const auto scale = static_cast<float>(p.scale);
  dense_attention_lse_cpu<float>(s, q.data_ptr<float>(), key.data_ptr<float>(), scale,
                                 lse.data_ptr<float>(), ctx);
  dense_index_lse_cpu<float>(s.indexer, q_I.data_ptr<float>(), k_I.data_ptr<float>(),
                             w.data_ptr<float>(), index_lse.data_ptr<float>(), ctx);
  dense_indexer_kl_cpu<float>(s, q.data_ptr<float>(), key.data_ptr<float>(), scale,
                              lse.data_ptr<float>(), q_I.data_ptr<float>(), k_I.data_ptr<float>(),
                              w.data_ptr<float>(), index_lse.data_ptr<float>(),
                              loss.data_ptr<float>(), gq.data_ptr<float>(), gk.data_ptr<float>(),
                              gw.data_ptr<float>(), ctx);
  return {lse, index_lse, loss, gq, gk, gw};
}

// Many row chunks and key tiles, so that threads take them in varying orders.
TEST_F(DenseIndexerKlTest, SameBitsForAnyThreadCount) {
  const Problem p = make_problem({150, 170, 3, 12, 4, 9, 20, 1}, Inputs::kGaussian);
  const auto one = run_kernels(p, 1);
  const char* names[] = {"lse", "index_lse", "loss", "grad_q_I", "grad_k_I", "grad_w"};
  for (const int threads : {2, 3, 8}) {
    const auto many = run_kernels(p, threads);
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(one[i].equal(many[i])) << names[i] << " with " << threads << " threads";
    }
  }
}

TEST_F(DenseIndexerKlTest, LogSumExpsAreTheDenseOnes) {
  const Problem p = make_problem({29, 35, 3, 7, 2, 6, 6, 1}, Inputs::kGaussian);
  const auto out = run_kernels(p, 2);
  const auto hidden = visible_mask(29, 35, 6, 1).logical_not();
  const auto logits = torch::einsum("thd,sd->ths", {p.q, p.key}) * p.scale;
  const auto scores =
      (torch::relu(torch::einsum("tjd,sd->tjs", {p.q_I, p.k_I})) * p.w.unsqueeze(-1)).sum(1);
  expect_close(out[0], torch::logsumexp(logits.masked_fill(hidden.unsqueeze(1), -INFINITY), -1),
               1e-5, "lse");
  expect_close(out[1], torch::logsumexp(scores.masked_fill(hidden, -INFINITY), -1), 1e-5,
               "index_lse");
}

TEST_F(DenseIndexerKlTest, BadArgumentsNameTheArgument) {
  const auto q = torch::randn({6, 2, 8}), key = torch::randn({6, 8});
  const auto q_I = torch::randn({6, 3, 4}), k_I = torch::randn({6, 4}), w = torch::randn({6, 3});
  const std::string op = "hyscale::dense_indexer_kl: ";
  test::expect_op_error(
      [&] {
        ops::dense_indexer_kl(q, torch::randn({6, 7}), q_I, k_I, w, 1.0);
      },
      op + "key must be [M, d_qk] with d_qk = 8");
  test::expect_op_error(
      [&] {
        ops::dense_indexer_kl(q, key, torch::randn({5, 3, 4}), k_I, w, 1.0);
      },
      op + "w must be [N, H_I]");
  test::expect_op_error(
      [&] {
        ops::dense_indexer_kl(q, key, torch::randn({5, 3, 4}), k_I, torch::randn({5, 3}), 1.0);
      },
      op + "q_I must have one row per query of q (6)");
  test::expect_op_error(
      [&] {
        ops::dense_indexer_kl(q, key, q_I, torch::randn({5, 4}), w, 1.0);
      },
      op + "k_I must have one row per key of key (6)");
  test::expect_op_error(
      [&] {
        ops::dense_indexer_kl(q, key, q_I, torch::randn({6, 5}), w, 1.0);
      },
      op + "k_I must be [M, d_I] with d_I = 4 (from q_I)");
  test::expect_op_error([&] { ops::dense_indexer_kl(q, key, q_I.to(torch::kInt), k_I, w, 1.0); },
                        op + "q_I must be a floating tensor");
  test::expect_op_error([&] { ops::dense_indexer_kl(q, key.unsqueeze(0), q_I, k_I, w, 1.0); },
                        op + "key must have the same batch layout");
  test::expect_op_error([&] { ops::dense_indexer_kl(q, key, q_I, k_I, w, 1.0, 0, 0); },
                        "tokens_per_key must be >= 1");
  test::expect_op_error(
      [&] {
        ops::dense_indexer_kl(q, key, q_I, k_I, w, 1.0, 0, 1, torch::zeros({6, 3}));
      },
      op + "lse must be [N, H] = [6, 2] (from q)");
}

// The attention's log-sum-exps, when given (the trainer passes its forward's), are what the op
// uses: the dense ones give its own result, shifted ones another.
TEST_F(DenseIndexerKlTest, GivenLogSumExpsAreTheOnesUsed) {
  for (const Dims& d : {Dims{29, 35, 3, 7, 2, 6, 6, 1}, Dims{19, 14, 2, 17, 4, 5, 5, 2}}) {
    SCOPED_TRACE(describe(d));
    const Problem p = make_problem(d, Inputs::kGaussian, {2});
    const auto visible = visible_mask(d.n, d.m, d.q_offset, d.tokens_per_key);
    const auto logits = torch::einsum("bthd,bsd->bths", {p.q, p.key}) * p.scale;
    const auto lse = torch::logsumexp(
        logits.masked_fill(visible.logical_not().unsqueeze(1), -INFINITY), -1);  // [B, N, H]
    const auto run = [&p](const torch::Tensor& given) {
      const auto r = ops::dense_indexer_kl(p.q, p.key, p.q_I, p.k_I, p.w, p.scale, p.q_offset,
                                           p.tokens_per_key, given);
      return Result{r.loss, r.grad_q, r.grad_k, r.grad_w};
    };
    const Result computed = run(torch::Tensor());
    expect_matches(run(lse), computed, 1e-12, "the dense lse");
    EXPECT_FALSE(run(lse + 0.5).loss.allclose(computed.loss)) << "a shifted lse was not used";
  }
}

// The CPU loop has no waves: any number of rows a call is as good as another.
TEST_F(DenseIndexerKlTest, CpuRowMultipleIsOne) {
  EXPECT_EQ(ops::dense_indexer_kl_row_multiple(torch::empty({64, 128})), 1);
}

}  // namespace
}  // namespace hyscale
