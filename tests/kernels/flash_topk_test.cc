// flash_topk against a full score table + sort in float64: exactness as DESIGN.md section 3
// defines it, the lower-index tie rule where scores are exact, bit-identical replay by
// index_score_gather, and independence from the thread count.
#include "kernels/flash_topk.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/index_score.h"
#include "tests/kernels/reference.h"
#include "tests/kernels/test_support.h"
#include "tests/kernels/topk_check.h"

namespace hyscale::test {
namespace {

template <typename T>
Selection<T> run_flash_topk(const IndexerProblem& p, int64_t topk, int threads) {
  Selection<T> out{std::vector<int32_t>(p.shape.num_queries * topk),
                   std::vector<T>(p.shape.num_queries * topk)};
  const auto q = to<T>(p.q), k = to<T>(p.k), w = to<T>(p.w);
  flash_topk_cpu<T>(p.shape, q.data(), k.data(), w.data(), topk, out.indices.data(),
                    out.scores.data(), CpuContext{threads});
  return out;
}

// Runs flash_topk on one problem with 1 and 3 threads and checks everything about the result.
template <typename T>
void check_problem(const IndexerProblem& problem, int64_t topk, bool exact_scores) {
  SCOPED_TRACE(describe(problem.shape) + " topk=" + std::to_string(topk));
  const IndexerProblem p = rounded<T>(problem);
  const Selection<T> got = run_flash_topk<T>(p, topk, 3);
  expect_exact_topk(p, topk, got, exact_scores);

  const Selection<T> serial = run_flash_topk<T>(p, topk, 1);
  EXPECT_EQ(got.indices, serial.indices) << "thread count changed the selection";
  EXPECT_TRUE(bit_identical(got.scores, serial.scores)) << "thread count changed the scores";

  // Selection replay recomputes exactly the scores the keys were selected with.
  std::vector<T> replayed(got.scores.size());
  const auto q = to<T>(p.q), k = to<T>(p.k), w = to<T>(p.w);
  index_score_gather_cpu<T>(p.shape, q.data(), k.data(), w.data(), got.indices.data(), topk,
                            replayed.data(), CpuContext{2});
  EXPECT_TRUE(bit_identical(replayed, got.scores)) << "replayed scores differ from selection";
}

template <typename T>
class FlashTopKTest : public TypedKernelTest<T> {};
TYPED_TEST_SUITE(FlashTopKTest, ScalarTypes);

TYPED_TEST(FlashTopKTest, ExactOnRandomShapesAndInputs) {
  for (int iter = 0; iter < 150; ++iter) {
    const auto inputs = static_cast<IndexerInputs>(iter % 4);
    const IndexerShape shape = random_indexer_shape(this->rng_, 40);
    const int64_t topk = this->rng_.uniform_int(1, 30);
    SCOPED_TRACE(describe(inputs));
    check_problem<TypeParam>(random_indexer_problem(this->rng_, shape, inputs), topk,
                             exact_scores(inputs));
    if (this->HasFatalFailure()) return;
  }
}

// Many more keys than 2 * topk: the candidate buffer is cut and the threshold raised many times,
// across many key tiles, with ties at the threshold.
TYPED_TEST(FlashTopKTest, ExactOnLongRowsWithManyPrunes) {
  for (const auto inputs : {IndexerInputs::kGaussian, IndexerInputs::kIntegers,
                            IndexerInputs::kIntegersNegativeWeights}) {
    IndexerShape shape;
    shape.num_queries = this->rng_.uniform_int(100, 180);
    shape.num_keys = shape.num_queries + this->rng_.uniform_int(0, 5);
    shape.heads = this->rng_.uniform_int(2, 4);
    shape.dim = this->rng_.uniform_int(5, 24);
    const int64_t topk = this->rng_.uniform_int(1, 9);
    SCOPED_TRACE(describe(inputs));
    check_problem<TypeParam>(random_indexer_problem(this->rng_, shape, inputs), topk,
                             exact_scores(inputs));
    if (this->HasFatalFailure()) return;
  }
}

// All scores equal (q . k <= 0 everywhere): the selection is the lowest visible indices.
TYPED_TEST(FlashTopKTest, AllTiedScoresSelectLowestIndices) {
  IndexerShape shape;
  shape.num_queries = 23;
  shape.num_keys = 30;
  shape.heads = 2;
  shape.dim = 3;
  shape.q_offset = 4;
  shape.visibility.tokens_per_key = 2;
  IndexerProblem p = random_indexer_problem(this->rng_, shape, IndexerInputs::kGaussian);
  for (double& x : p.q) x = std::abs(x);
  for (double& x : p.k) x = -std::abs(x);
  const int64_t topk = 5;
  const Selection<TypeParam> got = run_flash_topk<TypeParam>(p, topk, 3);
  for (int64_t row = 0; row < shape.num_queries; ++row) {
    const int64_t visible = shape.visible_keys(row);
    for (int64_t i = 0; i < topk; ++i) {
      EXPECT_EQ(got.indices[row * topk + i], i < visible ? i : -1)
          << "row " << row << " slot " << i;
      EXPECT_EQ(got.scores[row * topk + i],
                i < visible ? TypeParam(0) : -std::numeric_limits<TypeParam>::infinity());
    }
  }
}

TEST(FlashTopKShapeTest, RejectsNonPositiveTopKAndBadShapes) {
  IndexerShape shape;
  shape.num_queries = 2;
  shape.num_keys = 2;
  shape.heads = 1;
  shape.dim = 1;
  std::vector<float> q(2), k(2), w(2), scores(2);
  std::vector<int32_t> indices(2);
  const auto call = [&](int64_t topk) {
    flash_topk_cpu<float>(shape, q.data(), k.data(), w.data(), topk, indices.data(), scores.data(),
                          CpuContext{1});
  };
  try {
    call(0);
    FAIL() << "topk 0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("topk"), std::string::npos) << e.what();
  }
  shape.dim = 0;
  try {
    call(1);
    FAIL() << "dim 0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("IndexerShape.dim"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyscale::test
