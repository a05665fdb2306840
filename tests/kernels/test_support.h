// Shared by the kernel tests: a fixture with a fresh random seed per test (printed with every
// failure; HYSCALE_TEST_SEED=<seed> replays one), random data, tolerances per scalar type, and
// the comparisons the tests repeat.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace hyscale::test {

inline uint64_t choose_seed() {
  if (const char* fixed = std::getenv("HYSCALE_TEST_SEED"))
    return std::strtoull(fixed, nullptr, 10);
  std::random_device device;
  return (uint64_t{device()} << 32) | device();
}

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}

  int64_t uniform_int(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  bool chance(double p) { return uniform(0, 1) < p; }

  std::vector<double> normal(int64_t n, double stddev = 1) {
    std::normal_distribution<double> dist(0, stddev);
    std::vector<double> x(n);
    for (double& v : x) v = dist(engine_);
    return x;
  }
  // Small integers: products and sums stay exact in float, so scores collide exactly (ties).
  std::vector<double> integers(int64_t n, int64_t lo, int64_t hi) {
    std::vector<double> x(n);
    for (double& v : x) v = static_cast<double>(uniform_int(lo, hi));
    return x;
  }

 private:
  std::mt19937_64 engine_;
};

// Every test draws fresh inputs; the seed goes into every failure message.
class KernelTest : public ::testing::Test {
 protected:
  KernelTest()
      : seed_(choose_seed()),
        rng_(seed_),
        trace_(__FILE__, __LINE__,
               "seed " + std::to_string(seed_) +
                   " (replay: HYSCALE_TEST_SEED=" + std::to_string(seed_) + ")") {}

  uint64_t seed_;
  Random rng_;

 private:
  ::testing::ScopedTrace trace_;
};

template <typename T>
class TypedKernelTest : public KernelTest {};
using ScalarTypes = ::testing::Types<float, double>;

// Relative accuracy expected of a kernel in T against a float64 reference, per unit of the
// magnitude of the summed terms.
template <typename T>
constexpr double kRelTol = 1e-5;
template <>
constexpr double kRelTol<double> = 1e-12;

template <typename T>
std::vector<T> to(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}
template <typename T>
std::vector<double> to_double(const std::vector<T>& x) {
  return std::vector<double>(x.begin(), x.end());
}
// The inputs a kernel in T actually sees, back in double for the reference.
template <typename T>
std::vector<double> rounded(const std::vector<double>& x) {
  return to_double(to<T>(x));
}

// |got - want| <= tol * (scale + |want|) element by element, naming the first mismatch, with
// scale = max(1, max |want|): rounding errors scale with the terms summed, which the inputs (of
// order 1) and the largest result stand for. Infinite reference values must be matched exactly.
template <typename T>
void expect_near(const std::vector<T>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1;
  for (double x : want) {
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(static_cast<double>(got[i]), want[i]) << what << "[" << i << "]";
      continue;
    }
    ASSERT_NEAR(got[i], want[i], tol * (scale + std::abs(want[i]))) << what << "[" << i << "]";
  }
}

template <typename T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](T x, T y) {
           return std::memcmp(&x, &y, sizeof(T)) == 0;
         });
}

// Central differences of a scalar function of x, one element at a time, against `analytic`.
template <typename Loss>
void expect_matches_finite_differences(std::vector<double>& x, const std::vector<double>& analytic,
                                       Loss&& loss, const std::string& what) {
  constexpr double kStep = 1e-6, kTol = 1e-6;
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = loss();
    x[i] = saved - kStep;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * kStep);
    ASSERT_NEAR(analytic[i], numeric, kTol * std::max(1.0, std::abs(numeric)))
        << what << "[" << i << "]";
  }
}

}  // namespace hyscale::test
