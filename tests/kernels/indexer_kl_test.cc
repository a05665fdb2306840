// indexer_kl forward / backward against float64 references and finite differences: unused slots
// (-infinity scores), zero targets (0 log 0 = 0) and rows without any valid slot.
#include "kernels/indexer_kl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/kernels/reference.h"
#include "tests/kernels/test_support.h"

namespace hyscale::test {
namespace {

struct KlProblem {
  int64_t rows, topk;
  std::vector<double> score, target;  // [rows, topk]
};

// Scores with -inf in unused slots (some rows entirely), targets that sum to 1 over the valid
// slots (as the contract requires) with some exact zeros.
KlProblem random_kl_problem(Random& rng) {
  KlProblem p{rng.uniform_int(1, 20), rng.uniform_int(1, 17), {}, {}};
  p.score = rng.normal(p.rows * p.topk, 3);
  p.target.assign(p.rows * p.topk, 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const bool empty_row = rng.chance(0.1);
    double total = 0;
    for (int64_t i = 0; i < p.topk; ++i) {
      const int64_t e = r * p.topk + i;
      if (empty_row || (i > 0 && rng.chance(0.2))) {
        p.score[e] = -kInf;
      } else if (i == 0 || !rng.chance(0.2)) {  // slot 0: some target mass on a valid slot
        total += p.target[e] = rng.uniform(0.1, 1);
      }
    }
    for (int64_t i = 0; i < p.topk && total > 0; ++i) p.target[r * p.topk + i] /= total;
  }
  return p;
}

// loss[r] = sum_i p_i (log p_i - log_softmax(s)_i) over valid slots.
std::vector<double> ref_kl(const KlProblem& p) {
  std::vector<double> loss(p.rows, 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* s = p.score.data() + r * p.topk;
    const double* t = p.target.data() + r * p.topk;
    double sum = 0;
    for (int64_t i = 0; i < p.topk; ++i) sum += std::exp(s[i]);
    for (int64_t i = 0; i < p.topk; ++i) {
      if (s[i] != -kInf && t[i] > 0) loss[r] += t[i] * (std::log(t[i]) - (s[i] - std::log(sum)));
    }
  }
  return loss;
}

std::vector<double> ref_kl_grad(const KlProblem& p, const std::vector<double>& grad_loss) {
  std::vector<double> grad(p.score.size(), 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* s = p.score.data() + r * p.topk;
    double sum = 0;
    for (int64_t i = 0; i < p.topk; ++i) sum += std::exp(s[i]);
    for (int64_t i = 0; i < p.topk; ++i) {
      if (s[i] == -kInf) continue;
      grad[r * p.topk + i] = grad_loss[r] * (std::exp(s[i]) / sum - p.target[r * p.topk + i]);
    }
  }
  return grad;
}

// The kernels' normalizer: computed from the scores (score_lse empty) or given, a value a row.
template <typename T>
std::vector<T> kl_forward(const KlProblem& p, int threads = 3,
                          const std::vector<double>& score_lse = {}) {
  const auto score = to<T>(p.score), target = to<T>(p.target), lse = to<T>(score_lse);
  std::vector<T> loss(p.rows, std::numeric_limits<T>::quiet_NaN());
  indexer_kl_fwd_cpu<T>(p.rows, p.topk, score.data(), target.data(),
                        lse.empty() ? nullptr : lse.data(), loss.data(), CpuContext{threads});
  return loss;
}

template <typename T>
std::vector<T> kl_backward(const KlProblem& p, const std::vector<double>& grad_loss,
                           const std::vector<double>& score_lse = {}) {
  const auto score = to<T>(p.score), target = to<T>(p.target), g = to<T>(grad_loss);
  const auto lse = to<T>(score_lse);
  std::vector<T> grad(score.size(), std::numeric_limits<T>::quiet_NaN());
  indexer_kl_bwd_cpu<T>(p.rows, p.topk, score.data(), target.data(),
                        lse.empty() ? nullptr : lse.data(), g.data(), grad.data(), CpuContext{3});
  return grad;
}

// Each row's log sum_i exp(score_i) over its valid slots, in float64 (-infinity without one).
std::vector<double> ref_score_lse(const KlProblem& p) {
  std::vector<double> lse(p.rows);
  for (int64_t r = 0; r < p.rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < p.topk; ++i) sum += std::exp(p.score[r * p.topk + i]);
    lse[r] = std::log(sum);
  }
  return lse;
}

template <typename T>
KlProblem rounded_problem(const KlProblem& p) {
  return {p.rows, p.topk, rounded<T>(p.score), rounded<T>(p.target)};
}

template <typename T>
class IndexerKlTest : public TypedKernelTest<T> {};
TYPED_TEST_SUITE(IndexerKlTest, ScalarTypes);

TYPED_TEST(IndexerKlTest, ForwardAndBackwardMatchReference) {
  for (int iter = 0; iter < 100; ++iter) {
    const KlProblem p = rounded_problem<TypeParam>(random_kl_problem(this->rng_));
    SCOPED_TRACE("rows=" + std::to_string(p.rows) + " topk=" + std::to_string(p.topk));
    const auto grad_loss = rounded<TypeParam>(this->rng_.normal(p.rows));
    expect_near(kl_forward<TypeParam>(p), ref_kl(p), 10 * kRelTol<TypeParam>, "loss");
    expect_near(kl_backward<TypeParam>(p, grad_loss), ref_kl_grad(p, grad_loss), kRelTol<TypeParam>,
                "grad_score");
    if (this->HasFatalFailure()) return;
  }
}

// The normalizer given (the forward's, as the trainer passes it when the scores are formed again)
// gives the reference's loss and gradient, rows without a valid slot (-infinity) included.
TYPED_TEST(IndexerKlTest, AGivenNormalizerGivesTheReference) {
  for (int iter = 0; iter < 50; ++iter) {
    const KlProblem p = rounded_problem<TypeParam>(random_kl_problem(this->rng_));
    const auto grad_loss = rounded<TypeParam>(this->rng_.normal(p.rows));
    const auto lse = ref_score_lse(p);
    expect_near(kl_forward<TypeParam>(p, 3, lse), ref_kl(p), 10 * kRelTol<TypeParam>, "loss");
    expect_near(kl_backward<TypeParam>(p, grad_loss, lse), ref_kl_grad(p, grad_loss),
                kRelTol<TypeParam>, "grad_score");
    if (this->HasFatalFailure()) return;
  }
}

TEST_F(KernelTest, IndexerKlBackwardMatchesFiniteDifferences) {
  for (int iter = 0; iter < 20; ++iter) {
    KlProblem p = random_kl_problem(rng_);
    const auto grad_loss = rng_.normal(p.rows);
    const std::vector<double> got = kl_backward<double>(p, grad_loss);
    // Differentiate over the valid slots only; unused slots must get exactly 0.
    std::vector<double> valid_scores, valid_grads;
    for (size_t e = 0; e < p.score.size(); ++e) {
      if (p.score[e] == -kInf) {
        ASSERT_EQ(got[e], 0.0) << "unused slot " << e;
      } else {
        valid_scores.push_back(p.score[e]);
        valid_grads.push_back(got[e]);
      }
    }
    const auto loss = [&] {
      KlProblem probe = p;
      for (size_t e = 0, v = 0; e < probe.score.size(); ++e) {
        if (probe.score[e] != -kInf) probe.score[e] = valid_scores[v++];
      }
      const std::vector<double> l = kl_forward<double>(probe, 1);
      double total = 0;
      for (int64_t r = 0; r < p.rows; ++r) total += grad_loss[r] * l[r];
      return total;
    };
    expect_matches_finite_differences(valid_scores, valid_grads, loss, "grad_score");
    if (HasFatalFailure()) return;
  }
}

TEST(IndexerKlEdgeTest, RowWithoutValidSlotHasZeroLossAndGradient) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> score = {-inf, -inf, 0.5, -inf}, target = {0, 0, 1, 0};
  const std::vector<double> grad_loss = {1, 1};
  std::vector<double> loss(2), grad(4);
  indexer_kl_fwd_cpu<double>(2, 2, score.data(), target.data(), nullptr, loss.data(),
                             CpuContext{1});
  indexer_kl_bwd_cpu<double>(2, 2, score.data(), target.data(), nullptr, grad_loss.data(),
                             grad.data(), CpuContext{1});
  EXPECT_EQ(loss, (std::vector<double>{0, 0}));  // row 1: one valid slot holding all the mass
  EXPECT_EQ(grad, (std::vector<double>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace hyscale::test
