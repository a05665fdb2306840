// The CUDA flash_topk and index_score_gather against float64 references on fresh random inputs
// (DESIGN.md section 3): shapes that are not tile multiples, rows with t + 1 < k, q_offset > 0,
// compressed keys, strided threshold sampling, ties (integer inputs, exact everywhere, which also
// drive rows into the exact fallback) and all-negative weights. Skips without a GPU.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/torch/ops.h"
#include "tests/kernels/gpu_kernel_test.h"
#include "tests/kernels/reference.h"
#include "tests/kernels/topk_check.h"

namespace hyscale::test {
namespace {

// fp32 accumulation of bf16 products, in another order than the reference.
constexpr double kGpuRelTol = 2e-5;

class FlashTopkCudaTest : public GpuKernelTest {};

// Inputs on the GPU (q, k bf16; w fp32) and the float64 reference of exactly those values.
struct GpuProblem {
  IndexerShape shape;
  torch::Tensor q, k, w;
  std::vector<double> table, magnitude;  // [N, M] reference scores, sizes of the summed terms
};

torch::Tensor on_gpu(const std::vector<double>& x, std::vector<int64_t> sizes, torch::Dtype dtype) {
  return torch::tensor(x, torch::kDouble).reshape(sizes).to(dtype).to(torch::kCUDA);
}

std::vector<double> to_vector(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

GpuProblem make_problem(Random& rng, const IndexerShape& shape, IndexerInputs inputs) {
  const IndexerProblem p = random_indexer_problem(rng, shape, inputs);
  const int64_t n = shape.num_queries, m = shape.num_keys, h = shape.heads, d = shape.dim;
  GpuProblem g{shape,
               on_gpu(p.q, {n, h, d}, torch::kBFloat16),
               on_gpu(p.k, {m, d}, torch::kBFloat16),
               on_gpu(p.w, {n, h}, torch::kFloat),
               {},
               {}};
  const auto q = g.q.to(torch::kDouble), k = g.k.to(torch::kDouble), w = g.w.to(torch::kDouble);
  std::vector<torch::Tensor> scores, magnitudes;
  for (int64_t row = 0; row < n; row += 256) {
    const auto rows = q.slice(0, row, std::min(n, row + 256));
    const auto dots = torch::einsum("nhd,md->nhm", {rows, k});
    const auto abs_dots = torch::einsum("nhd,md->nhm", {rows.abs(), k.abs()});
    const auto wr = w.slice(0, row, std::min(n, row + 256)).unsqueeze(-1);
    scores.push_back((wr * dots.clamp_min(0)).sum(1));
    magnitudes.push_back((wr.abs() * abs_dots).sum(1));
  }
  g.table = to_vector(torch::cat(scores));
  g.magnitude = to_vector(torch::cat(magnitudes));
  return g;
}

Selection<float> run_flash_topk(const GpuProblem& g, int64_t topk) {
  const auto sel =
      ops::flash_topk(g.q, g.k, g.w, topk, g.shape.q_offset, g.shape.visibility.tokens_per_key);
  const auto idx = sel.indices.cpu().contiguous(), sc = sel.scores.cpu().contiguous();
  return {std::vector<int32_t>(idx.data_ptr<int32_t>(), idx.data_ptr<int32_t>() + idx.numel()),
          std::vector<float>(sc.data_ptr<float>(), sc.data_ptr<float>() + sc.numel())};
}

void check(const GpuProblem& g, int64_t topk, bool exact_scores) {
  SCOPED_TRACE(describe(g.shape) + " topk=" + std::to_string(topk));
  const Selection<float> got = run_flash_topk(g, topk);
  const int64_t m = g.shape.num_keys;
  expect_exact_topk_rows<float>(
      g.shape.num_queries, topk, got, exact_scores, kGpuRelTol,
      [&](int64_t row) {
        const double* begin = g.table.data() + row * m;
        return std::vector<double>(begin, begin + g.shape.visible_keys(row));
      },
      [&](int64_t row, int64_t key) { return g.magnitude[row * m + key]; });

  // Deterministic: the same bits on a second run.
  const Selection<float> again = run_flash_topk(g, topk);
  EXPECT_EQ(got.indices, again.indices) << "second run selected differently";
  EXPECT_TRUE(bit_identical(got.scores, again.scores)) << "second run scored differently";

  // Selection replay recomputes exactly the scores the keys were selected with.
  const auto indices =
      torch::tensor(got.indices, torch::kInt).reshape({g.shape.num_queries, topk}).to(torch::kCUDA);
  const auto replayed = ops::index_score_gather(g.q, g.k, g.w, indices, g.shape.q_offset,
                                                g.shape.visibility.tokens_per_key)
                            .cpu()
                            .contiguous();
  const std::vector<float> replay(replayed.data_ptr<float>(),
                                  replayed.data_ptr<float>() + replayed.numel());
  EXPECT_TRUE(bit_identical(replay, got.scores)) << "replayed scores differ from selection";
}

struct Case {
  int64_t rows, keys, heads, dim, topk, q_offset, tokens_per_key;
  IndexerInputs inputs;
};

IndexerShape shape_of(const Case& c) {
  IndexerShape s;
  s.num_queries = c.rows;
  s.num_keys = c.keys;
  s.heads = c.heads;
  s.dim = c.dim;
  s.q_offset = c.q_offset;
  s.visibility.tokens_per_key = c.tokens_per_key;
  return s;
}

TEST_F(FlashTopkCudaTest, ExactOnOddShapesShardsAndCompressedKeys) {
  const Case cases[] = {
      // rows keys  H    d    k     q_off  m  inputs
      {1000, 1000, 64, 128, 64, 0, 1, IndexerInputs::kGaussian},  // threshold from all keys
      {777, 780, 32, 64, 100, 0, 1, IndexerInputs::kGaussianNegativeWeights},
      {300, 300, 16, 128, 512, 0, 1, IndexerInputs::kGaussian},     // every row t + 1 < k
      {509, 3509, 64, 64, 256, 3000, 1, IndexerInputs::kGaussian},  // a shard: q_offset > 0
      {2003, 503, 16, 64, 32, 0, 4, IndexerInputs::kGaussian},      // compressed keys
      {6001, 6001, 16, 64, 64, 0, 1, IndexerInputs::kGaussian},     // strided sample (stride 2)
      {4100, 4100, 64, 128, 2048, 0, 1, IndexerInputs::kGaussian},  // the DSA k, t + 1 < k rows
      {5000, 5000, 16, 64, 4096, 0, 1, IndexerInputs::kGaussian},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c.inputs));
    check(make_problem(rng_, shape_of(c), c.inputs), c.topk, false);
    if (HasFatalFailure()) return;
  }
}

TEST_F(FlashTopkCudaTest, TiesKeepTheLowestKeysExactly) {
  const Case cases[] = {
      {1500, 1500, 16, 64, 128, 0, 1, IndexerInputs::kIntegers},
      {1500, 1500, 32, 64, 96, 0, 1, IndexerInputs::kIntegersNegativeWeights},
      {4500, 4500, 16, 128, 256, 0, 1, IndexerInputs::kIntegers},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c.inputs));
    check(make_problem(rng_, shape_of(c), c.inputs), c.topk, true);
    if (HasFatalFailure()) return;
  }
}

TEST_F(FlashTopkCudaTest, GatherMatchesTheReferenceAtRandomIndices) {
  const Case c{333, 1200, 64, 128, 0, 700, 1, IndexerInputs::kGaussian};
  const GpuProblem g = make_problem(rng_, shape_of(c), c.inputs);
  const int64_t topk = 77;
  std::vector<int32_t> indices(c.rows * topk);
  for (int64_t row = 0; row < c.rows; ++row) {
    const int64_t visible = g.shape.visible_keys(row);
    for (int64_t i = 0; i < topk; ++i) {
      indices[row * topk + i] =
          rng_.chance(0.1) ? -1 : static_cast<int32_t>(rng_.uniform_int(0, visible - 1));
    }
  }
  const auto got = ops::index_score_gather(
                       g.q, g.k, g.w,
                       torch::tensor(indices, torch::kInt).reshape({c.rows, topk}).to(torch::kCUDA),
                       c.q_offset, 1)
                       .cpu()
                       .contiguous();
  const float* scores = got.data_ptr<float>();
  for (int64_t j = 0; j < c.rows * topk; ++j) {
    const int64_t row = j / topk, key = indices[j];
    if (key < 0) {
      ASSERT_TRUE(std::isinf(scores[j]) && scores[j] < 0) << "slot " << j;
      continue;
    }
    ASSERT_NEAR(scores[j], g.table[row * c.keys + key],
                kGpuRelTol * g.magnitude[row * c.keys + key])
        << "row " << row << " key " << key;
  }
}

TEST_F(FlashTopkCudaTest, RejectsShapesTheKernelsAreNotBuiltFor) {
  const auto q = torch::randn({8, 8, 64}, torch::kCUDA), k = torch::randn({8, 64}, torch::kCUDA);
  const auto w = torch::randn({8, 8}, torch::kCUDA);
  try {
    ops::flash_topk(q, k, w, 4, 0, 1);
    FAIL() << "H_I = 8 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_I"), std::string::npos) << e.what();
  }
  const auto q16 = torch::randn({8, 16, 64}, torch::kCUDA),
             w16 = torch::randn({8, 16}, torch::kCUDA);
  try {
    ops::flash_topk(q16, k, w16, 5000, 0, 1);
    FAIL() << "topk 5000 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyscale::test
