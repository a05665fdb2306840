// The exactness check of a top-k selection (DESIGN.md section 3), shared by the CPU and CUDA
// flash_topk tests: layout, causality, key order, the set rule with ties within eps of tau, and
// with exact scores the whole list including the lower-index tie rule.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tests/kernels/reference.h"

namespace hyscale::test {

template <typename T>
struct Selection {
  std::vector<int32_t> indices;
  std::vector<T> scores;
};

// Checks rows [0, rows) of `got` against a float64 reference: `reference_row(row)` gives the
// scores of the row's visible keys, `magnitude(row, key)` the size of the terms summed into one
// score (its rounding error is at most `rel_tol` times that). With `rounding_in_ties`, the set
// rule's eps also takes in twice that error bound at the row's largest magnitude: for kernels
// whose accumulation is coarser than eps (fp8 tensor cores), ties are then decided by rounding.
template <typename T>
void expect_exact_topk_rows(int64_t rows, int64_t topk, const Selection<T>& got, bool exact_scores,
                            double rel_tol,
                            const std::function<std::vector<double>(int64_t)>& reference_row,
                            const std::function<double(int64_t, int64_t)>& magnitude,
                            bool rounding_in_ties = false) {
  for (int64_t row = 0; row < rows; ++row) {
    SCOPED_TRACE("row " + std::to_string(row));
    const std::vector<double> ref = reference_row(row);
    const int64_t visible = ref.size(), selected = std::min(topk, visible);
    const int32_t* idx = got.indices.data() + row * topk;
    const T* score = got.scores.data() + row * topk;

    // Layout: `selected` valid, causal, distinct keys, then -1 / -infinity.
    std::vector<bool> chosen(visible, false);
    for (int64_t i = 0; i < topk; ++i) {
      if (i >= selected) {
        ASSERT_EQ(idx[i], -1) << "slot " << i;
        ASSERT_EQ(score[i], -std::numeric_limits<T>::infinity()) << "slot " << i;
        continue;
      }
      ASSERT_GE(idx[i], 0) << "slot " << i;
      ASSERT_LT(idx[i], visible) << "slot " << i << ": not visible (causal)";
      ASSERT_FALSE(chosen[idx[i]]) << "slot " << i << ": key " << idx[i] << " twice";
      chosen[idx[i]] = true;
      // The kernel's score is the key's score, to rounding.
      ASSERT_NEAR(score[i], ref[idx[i]], rel_tol * magnitude(row, idx[i])) << "slot " << i;
      // In ascending key order.
      if (i > 0) {
        ASSERT_LT(idx[i - 1], idx[i]) << "slots " << i - 1 << ", " << i << " out of order";
      }
    }
    if (selected == 0) continue;

    // Exactness (DESIGN.md section 3): compare sets, with ties within eps of tau either way.
    std::vector<double> sorted = ref;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double eps = 1e-4 * std::abs(sorted[selected - 1]);
    if (rounding_in_ties) {
      double largest = 0;
      for (int64_t s = 0; s < visible; ++s) largest = std::max(largest, magnitude(row, s));
      eps += 2 * rel_tol * largest;
    }
    const double tau = sorted[selected - 1];
    for (int64_t i = 0; i < selected; ++i) {
      ASSERT_GE(ref[idx[i]], tau - eps) << "slot " << i << " key " << idx[i] << " tau " << tau;
    }
    for (int64_t s = 0; s < visible; ++s) {
      ASSERT_TRUE(chosen[s] || ref[s] <= tau + eps) << "key " << s << " missed, tau " << tau;
    }

    if (exact_scores) {
      const std::vector<int32_t> want = ref_topk_row(ref, topk);
      for (int64_t i = 0; i < selected; ++i) {
        ASSERT_EQ(idx[i], want[i]) << "slot " << i << " (tie rule: lower index wins)";
        ASSERT_EQ(static_cast<double>(score[i]), ref[want[i]]) << "slot " << i;
      }
    }
  }
}

// Against the reference of an IndexerProblem (`p` holds the inputs the kernel saw, rounded).
template <typename T>
void expect_exact_topk(const IndexerProblem& p, int64_t topk, const Selection<T>& got,
                       bool exact_scores, double rel_tol = kRelTol<T>) {
  expect_exact_topk_rows<T>(
      p.shape.num_queries, topk, got, exact_scores, rel_tol,
      [&](int64_t row) { return ref_score_row(p, row); },
      [&](int64_t row, int64_t key) { return index_score_magnitude(p, row, key); });
}

}  // namespace hyscale::test
