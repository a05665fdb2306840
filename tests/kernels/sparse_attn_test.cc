// sparse_attn forward / backward and selected_attention_mass against float64 references and
// finite differences, and backward independence from the thread count.
#include "kernels/sparse_attn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tests/kernels/reference.h"
#include "tests/kernels/test_support.h"

namespace hyscale::test {
namespace {

template <typename T>
struct Outputs {
  std::vector<T> out, lse;
};

template <typename T>
Outputs<T> forward(const AttnProblem& p, int threads) {
  const SparseAttnShape& s = p.shape;
  const auto q = to<T>(p.q), key = to<T>(p.key), value = to<T>(p.value);
  const T nan = std::numeric_limits<T>::quiet_NaN();  // the kernel must write every element
  Outputs<T> r{std::vector<T>(s.num_queries * s.heads * s.dim_v, nan),
               std::vector<T>(s.num_queries * s.heads, nan)};
  sparse_attn_fwd_cpu<T>(s, q.data(), key.data(), value.data(), p.indices.data(),
                         static_cast<T>(p.scale), r.out.data(), r.lse.data(), CpuContext{threads});
  return r;
}

template <typename T>
struct Grads {
  std::vector<T> q, key, value;
};

// Backward of sum(out * grad_out), fed with the kernel's own forward outputs.
template <typename T>
Grads<T> backward(const AttnProblem& p, const std::vector<double>& grad_out, int threads) {
  const SparseAttnShape& s = p.shape;
  const auto q = to<T>(p.q), key = to<T>(p.key), value = to<T>(p.value), g = to<T>(grad_out);
  const Outputs<T> fwd = forward<T>(p, threads);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Grads<T> r{std::vector<T>(q.size(), nan), std::vector<T>(key.size(), nan),
             std::vector<T>(value.size(), nan)};
  sparse_attn_bwd_cpu<T>(s, q.data(), key.data(), value.data(), p.indices.data(),
                         static_cast<T>(p.scale), fwd.out.data(), fwd.lse.data(), g.data(),
                         r.q.data(), r.key.data(), r.value.data(), CpuContext{threads});
  return r;
}

template <typename T>
class SparseAttnTest : public TypedKernelTest<T> {};
TYPED_TEST_SUITE(SparseAttnTest, ScalarTypes);

TYPED_TEST(SparseAttnTest, ForwardMatchesReference) {
  for (int iter = 0; iter < 100; ++iter) {
    const AttnProblem p = rounded<TypeParam>(random_attn_problem(this->rng_, 13));
    SCOPED_TRACE(describe(p.shape));
    const AttnOutputs want = ref_sparse_attn(p);
    const Outputs<TypeParam> got = forward<TypeParam>(p, 3);
    expect_near(got.out, want.out, kRelTol<TypeParam>, "out");
    expect_near(got.lse, want.lse, kRelTol<TypeParam>, "lse");  // -inf in rows without keys
    if (this->HasFatalFailure()) return;
  }
}

TYPED_TEST(SparseAttnTest, BackwardMatchesReference) {
  for (int iter = 0; iter < 100; ++iter) {
    const AttnProblem p = rounded<TypeParam>(random_attn_problem(this->rng_, 13));
    SCOPED_TRACE(describe(p.shape));
    const auto grad_out =
        rounded<TypeParam>(this->rng_.normal(p.shape.num_queries * p.shape.heads * p.shape.dim_v));
    const AttnGrads want = ref_sparse_attn_backward(p, grad_out);
    const Grads<TypeParam> got = backward<TypeParam>(p, grad_out, 3);
    // Softmax gradients cancel (p * (dp - D)): allow a few more ulps than a plain sum.
    expect_near(got.q, want.q, 10 * kRelTol<TypeParam>, "grad_q");
    expect_near(got.key, want.key, 10 * kRelTol<TypeParam>, "grad_key");
    expect_near(got.value, want.value, kRelTol<TypeParam>, "grad_value");
    if (this->HasFatalFailure()) return;
  }
}

TEST_F(KernelTest, SparseAttnBackwardMatchesFiniteDifferences) {
  for (int iter = 0; iter < 12; ++iter) {
    AttnProblem p = random_attn_problem(rng_, 5);
    SCOPED_TRACE(describe(p.shape));
    const auto grad_out = rng_.normal(p.shape.num_queries * p.shape.heads * p.shape.dim_v);
    const Grads<double> got = backward<double>(p, grad_out, 2);
    const auto loss = [&] {
      const std::vector<double> out = forward<double>(p, 1).out;
      double total = 0;
      for (size_t e = 0; e < out.size(); ++e) total += out[e] * grad_out[e];
      return total;
    };
    expect_matches_finite_differences(p.q, got.q, loss, "grad_q");
    expect_matches_finite_differences(p.key, got.key, loss, "grad_key");
    expect_matches_finite_differences(p.value, got.value, loss, "grad_value");
    if (HasFatalFailure()) return;
  }
}

TYPED_TEST(SparseAttnTest, BackwardIsBitIdenticalForAnyThreadCount) {
  AttnProblem p = random_attn_problem(this->rng_, 13);
  p.shape.num_queries = 83;
  p.shape.num_keys = 301;
  p.shape.topk = 7;
  p.q = this->rng_.normal(p.shape.num_queries * p.shape.heads * p.shape.dim_qk);
  p.key = this->rng_.normal(p.shape.num_keys * p.shape.dim_qk);
  p.value = this->rng_.normal(p.shape.num_keys * p.shape.dim_v);
  p.indices = clustered_indices(this->rng_, p.shape.num_queries, p.shape.topk, p.shape.num_keys);
  const auto grad_out = this->rng_.normal(p.shape.num_queries * p.shape.heads * p.shape.dim_v);
  const Grads<TypeParam> one = backward<TypeParam>(p, grad_out, 1);
  const Grads<TypeParam> three = backward<TypeParam>(p, grad_out, 3);
  EXPECT_TRUE(bit_identical(one.q, three.q));
  EXPECT_TRUE(bit_identical(one.key, three.key));
  EXPECT_TRUE(bit_identical(one.value, three.value));
}

TYPED_TEST(SparseAttnTest, SelectedMassMatchesReference) {
  for (int iter = 0; iter < 100; ++iter) {
    const AttnProblem p = rounded<TypeParam>(random_attn_problem(this->rng_, 13));
    SCOPED_TRACE(describe(p.shape));
    const SparseAttnShape& s = p.shape;
    const Outputs<TypeParam> fwd = forward<TypeParam>(p, 1);
    const auto q = to<TypeParam>(p.q), key = to<TypeParam>(p.key);
    std::vector<TypeParam> mass(s.num_queries * s.topk,
                                std::numeric_limits<TypeParam>::quiet_NaN());
    selected_attention_mass_cpu<TypeParam>(s, q.data(), key.data(), p.indices.data(),
                                           fwd.lse.data(), static_cast<TypeParam>(p.scale),
                                           mass.data(), CpuContext{3});
    expect_near(mass, ref_selected_mass(p), kRelTol<TypeParam>, "mass");
    if (this->HasFatalFailure()) return;
  }
}

TEST(SparseAttnShapeTest, BackwardRejectsIndicesOutsideTheKeys) {
  SparseAttnShape s;
  s.num_queries = 2;
  s.num_keys = 3;
  s.heads = 1;
  s.dim_qk = 2;
  s.dim_v = 2;
  s.topk = 2;
  const std::vector<int32_t> indices = {0, 1, 3, -1};
  std::vector<float> q(4), key(6), value(6), out(4), lse(2), g(4), gq(4), gk(6), gv(6);
  EXPECT_THROW(sparse_attn_bwd_cpu<float>(s, q.data(), key.data(), value.data(), indices.data(),
                                          1.0f, out.data(), lse.data(), g.data(), gq.data(),
                                          gk.data(), gv.data(), CpuContext{1}),
               std::invalid_argument);
}

}  // namespace
}  // namespace hyscale::test
