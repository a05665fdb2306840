// index_score_gather and index_score_backward against float64 references, finite differences,
// thread-count independence, and validate_indices.
#include "kernels/index_score.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tests/kernels/reference.h"
#include "tests/kernels/test_support.h"

namespace hyscale::test {
namespace {

// Random selections that validate_indices accepts: visible keys (duplicates allowed) and -1.
std::vector<int32_t> random_visible_indices(Random& rng, const IndexerShape& shape, int64_t topk) {
  std::vector<int32_t> indices(shape.num_queries * topk);
  for (int64_t row = 0; row < shape.num_queries; ++row) {
    const int64_t visible = shape.visible_keys(row);
    for (int64_t i = 0; i < topk; ++i) {
      indices[row * topk + i] = visible == 0 || rng.chance(0.15)
                                    ? -1
                                    : static_cast<int32_t>(rng.uniform_int(0, visible - 1));
    }
  }
  return indices;
}

template <typename T>
std::vector<T> gather(const IndexerProblem& p, const std::vector<int32_t>& indices, int64_t topk,
                      int threads = 3) {
  const auto q = to<T>(p.q), k = to<T>(p.k), w = to<T>(p.w);
  std::vector<T> scores(p.shape.num_queries * topk);
  index_score_gather_cpu<T>(p.shape, q.data(), k.data(), w.data(), indices.data(), topk,
                            scores.data(), CpuContext{threads});
  return scores;
}

template <typename T>
struct Grads {
  std::vector<T> q, k, w;
};

template <typename T>
Grads<T> backward(const IndexerProblem& p, const std::vector<int32_t>& indices, int64_t topk,
                  const std::vector<double>& grad_scores, int threads) {
  const auto q = to<T>(p.q), k = to<T>(p.k), w = to<T>(p.w), g = to<T>(grad_scores);
  // Poisoned outputs: the kernel must overwrite every element.
  const T poison = std::numeric_limits<T>::quiet_NaN();
  Grads<T> out{std::vector<T>(q.size(), poison), std::vector<T>(k.size(), poison),
               std::vector<T>(w.size(), poison)};
  index_score_backward_cpu<T>(p.shape, q.data(), k.data(), w.data(), indices.data(), topk, g.data(),
                              out.q.data(), out.k.data(), out.w.data(), CpuContext{threads});
  return out;
}

// A random problem with a random selection, and its grad_scores.
struct BackwardCase {
  IndexerProblem problem;
  int64_t topk;
  std::vector<int32_t> indices;
  std::vector<double> grad_scores;
};

BackwardCase random_backward_case(Random& rng, int64_t max_rows, IndexerInputs inputs) {
  const IndexerShape shape = random_indexer_shape(rng, max_rows);
  const int64_t topk = rng.uniform_int(1, 12);
  return {random_indexer_problem(rng, shape, inputs), topk,
          random_visible_indices(rng, shape, topk), rng.normal(shape.num_queries * topk)};
}

template <typename T>
class IndexScoreTest : public TypedKernelTest<T> {};
TYPED_TEST_SUITE(IndexScoreTest, ScalarTypes);

TYPED_TEST(IndexScoreTest, GatherMatchesReference) {
  for (int iter = 0; iter < 100; ++iter) {
    const auto inputs = static_cast<IndexerInputs>(iter % 4);
    const IndexerShape shape = random_indexer_shape(this->rng_, 30);
    const int64_t topk = this->rng_.uniform_int(1, 25);
    const IndexerProblem p = rounded<TypeParam>(random_indexer_problem(this->rng_, shape, inputs));
    const auto indices = random_visible_indices(this->rng_, shape, topk);
    SCOPED_TRACE(describe(shape) + " topk=" + std::to_string(topk) + ", " + describe(inputs));
    const std::vector<TypeParam> got = gather<TypeParam>(p, indices, topk);
    for (int64_t e = 0; e < shape.num_queries * topk; ++e) {
      const int64_t row = e / topk;
      if (indices[e] < 0) {
        ASSERT_EQ(got[e], -std::numeric_limits<TypeParam>::infinity()) << "entry " << e;
      } else {
        ASSERT_NEAR(got[e], ref_index_score(p, row, indices[e]),
                    kRelTol<TypeParam> * index_score_magnitude(p, row, indices[e]))
            << "entry " << e;
      }
    }
  }
}

TYPED_TEST(IndexScoreTest, BackwardMatchesReference) {
  for (int iter = 0; iter < 100; ++iter) {
    const auto inputs = static_cast<IndexerInputs>(iter % 4);
    const BackwardCase c = random_backward_case(this->rng_, 30, inputs);
    SCOPED_TRACE(describe(c.problem.shape) + " topk=" + std::to_string(c.topk) + ", " +
                 describe(inputs));
    const IndexerProblem p = rounded<TypeParam>(c.problem);
    const auto grad_scores = rounded<TypeParam>(c.grad_scores);
    const IndexerGrads want = ref_index_score_backward(p, c.indices, c.topk, grad_scores);
    const Grads<TypeParam> got = backward<TypeParam>(p, c.indices, c.topk, grad_scores, 3);
    expect_near(got.q, want.q, kRelTol<TypeParam>, "grad_q");
    expect_near(got.k, want.k, kRelTol<TypeParam>, "grad_k");
    expect_near(got.w, want.w, kRelTol<TypeParam>, "grad_w");
    if (this->HasFatalFailure()) return;
  }
}

// Gradients of L = sum g * I[t, indices[t, i]] in double against central differences of L
// computed with index_score_gather. Inputs stay away from ReLU kinks (|q . k| >= 1e-3 at every
// selected entry), where the function is linear in each variable between kinks.
TEST_F(KernelTest, IndexScoreBackwardMatchesFiniteDifferences) {
  for (int iter = 0; iter < 20; ++iter) {
    BackwardCase c = random_backward_case(rng_, 9, IndexerInputs::kGaussian);
    IndexerProblem& p = c.problem;
    bool near_kink = false;
    for (int64_t e = 0; e < static_cast<int64_t>(c.indices.size()); ++e) {
      for (int64_t j = 0; j < p.shape.heads && c.indices[e] >= 0; ++j) {
        near_kink |= std::abs(head_dot(p, e / c.topk, j, c.indices[e])) < 1e-3;
      }
    }
    if (near_kink) continue;
    SCOPED_TRACE(describe(p.shape) + " topk=" + std::to_string(c.topk));
    const Grads<double> got = backward<double>(p, c.indices, c.topk, c.grad_scores, 2);
    const auto loss = [&] {
      const std::vector<double> scores = gather<double>(p, c.indices, c.topk, 1);
      double total = 0;
      for (size_t e = 0; e < scores.size(); ++e) {
        if (c.indices[e] >= 0) total += c.grad_scores[e] * scores[e];
      }
      return total;
    };
    expect_matches_finite_differences(p.q, got.q, loss, "grad_q");
    expect_matches_finite_differences(p.k, got.k, loss, "grad_k");
    expect_matches_finite_differences(p.w, got.w, loss, "grad_w");
    if (HasFatalFailure()) return;
  }
}

TYPED_TEST(IndexScoreTest, BackwardIsBitIdenticalForAnyThreadCount) {
  IndexerShape shape;
  shape.num_queries = 97;
  shape.num_keys = 301;
  shape.heads = 3;
  shape.dim = 11;
  shape.q_offset = 300;  // every row sees every key
  const int64_t topk = 6;
  const IndexerProblem p = random_indexer_problem(this->rng_, shape, IndexerInputs::kGaussian);
  const auto indices = clustered_indices(this->rng_, shape.num_queries, topk, shape.num_keys);
  const auto grad_scores = this->rng_.normal(indices.size());
  const Grads<TypeParam> one = backward<TypeParam>(p, indices, topk, grad_scores, 1);
  const Grads<TypeParam> three = backward<TypeParam>(p, indices, topk, grad_scores, 3);
  EXPECT_TRUE(bit_identical(one.q, three.q));
  EXPECT_TRUE(bit_identical(one.k, three.k));
  EXPECT_TRUE(bit_identical(one.w, three.w));
}

IndexerShape shard_shape() {
  IndexerShape shape;  // rows at positions 5.., two tokens per key: row r sees (r + 6) / 2 keys
  shape.num_queries = 4;
  shape.num_keys = 10;
  shape.heads = 1;
  shape.dim = 1;
  shape.q_offset = 5;
  shape.visibility.tokens_per_key = 2;
  return shape;
}

TEST(ValidateIndicesTest, AcceptsVisibleKeysUnusedSlotsAndDuplicates) {
  // Visible keys per row: 3, 3, 4, 4 (key s needs 2s + 1 <= 5 + row).
  const std::vector<int32_t> indices = {2, 2, -1, 0, 1, 2, 3, 3, -1, -1, 3, 0, 1, 2};
  EXPECT_NO_THROW(validate_indices(shard_shape(), indices.data(), 3));
}

TEST(ValidateIndicesTest, RejectsNonCausalAndOutOfRangeIndices) {
  const IndexerShape shape = shard_shape();
  for (const auto& [row, slot, bad] :
       std::vector<std::tuple<int, int, int32_t>>{
           {0, 1, 3},    // key 3 covers tokens 6..7, row 0 is at position 5
           {1, 0, 3},    // position 6 still does not see the end of key 3
           {3, 2, 4},    // position 8 sees keys 0..3
           {2, 0, 10},   // beyond num_keys
           {0, 0, -2}})  // negative but not -1
  {
    std::vector<int32_t> indices(shape.num_queries * 3, 0);
    indices[row * 3 + slot] = bad;
    try {
      validate_indices(shape, indices.data(), 3);
      ADD_FAILURE() << "accepted indices[" << row << ", " << slot << "] = " << bad;
    } catch (const std::invalid_argument& e) {
      const std::string where =
          "indices[" + std::to_string(row) + ", " + std::to_string(slot) + "]";
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  }
}

TEST(IndexScoreBackwardTest, RejectsIndicesOutsideTheKeys) {
  const IndexerShape shape = shard_shape();
  std::vector<int32_t> indices(shape.num_queries * 2, 0);
  indices[5] = 10;
  std::vector<double> q(4), k(10), w(4), g(8), gq(4), gk(10), gw(4);
  EXPECT_THROW(
      index_score_backward_cpu<double>(shape, q.data(), k.data(), w.data(), indices.data(), 2,
                                       g.data(), gq.data(), gk.data(), gw.data(), CpuContext{1}),
      std::invalid_argument);
}

}  // namespace
}  // namespace hyscale::test
