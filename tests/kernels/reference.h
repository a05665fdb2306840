// Random problems for the kernel tests and their float64 reference results, written the direct
// way: full score tables, sorts and plain loops, nothing shared with the kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/shapes.h"
#include "tests/kernels/test_support.h"

namespace hyscale::test {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Lightning indexer ----

enum class IndexerInputs {
  kGaussian,
  kGaussianNegativeWeights,
  kIntegers,  // many exactly equal scores, exact in float as well
  kIntegersNegativeWeights,
};

inline std::string describe(IndexerInputs inputs) {
  switch (inputs) {
    case IndexerInputs::kGaussian:
      return "gaussian";
    case IndexerInputs::kGaussianNegativeWeights:
      return "gaussian, negative w";
    case IndexerInputs::kIntegers:
      return "integers (ties)";
    case IndexerInputs::kIntegersNegativeWeights:
      return "integers (ties), negative w";
  }
  return "?";
}

inline bool exact_scores(IndexerInputs inputs) {
  return inputs == IndexerInputs::kIntegers || inputs == IndexerInputs::kIntegersNegativeWeights;
}

struct IndexerProblem {
  IndexerShape shape;
  std::vector<double> q, k, w;  // [N, H_I, d_I], [M, d_I], [N, H_I]
};

inline std::string describe(const IndexerShape& s) {
  return "N=" + std::to_string(s.num_queries) + " M=" + std::to_string(s.num_keys) +
         " H_I=" + std::to_string(s.heads) + " d_I=" + std::to_string(s.dim) +
         " q_offset=" + std::to_string(s.q_offset) +
         " tokens_per_key=" + std::to_string(s.visibility.tokens_per_key);
}

// Odd sizes, shards with q_offset > 0, compressed keys (tokens_per_key > 1), and num_keys both
// short of and beyond the last row's visible keys.
inline IndexerShape random_indexer_shape(Random& rng, int64_t max_rows) {
  IndexerShape s;
  s.num_queries = rng.uniform_int(1, max_rows);
  s.heads = rng.uniform_int(1, 5);
  s.dim = rng.uniform_int(1, 37);
  s.q_offset = rng.chance(0.5) ? rng.uniform_int(1, 25) : 0;
  s.visibility.tokens_per_key = rng.chance(0.5) ? 1 : rng.uniform_int(2, 4);
  const int64_t last_visible = (s.q_offset + s.num_queries) / s.visibility.tokens_per_key;
  s.num_keys = std::max<int64_t>(0, last_visible + rng.uniform_int(-3, 4));
  return s;
}

inline IndexerProblem random_indexer_problem(Random& rng, const IndexerShape& shape,
                                             IndexerInputs inputs) {
  IndexerProblem p{shape, {}, {}, {}};
  const int64_t nq = shape.num_queries * shape.heads * shape.dim, nk = shape.num_keys * shape.dim;
  const int64_t nw = shape.num_queries * shape.heads;
  const bool negative = inputs == IndexerInputs::kGaussianNegativeWeights ||
                        inputs == IndexerInputs::kIntegersNegativeWeights;
  if (exact_scores(inputs)) {
    p.q = rng.integers(nq, -2, 2);
    p.k = rng.integers(nk, -2, 2);
    p.w = negative ? rng.integers(nw, -3, -1) : rng.integers(nw, -1, 3);
  } else {
    p.q = rng.normal(nq);
    p.k = rng.normal(nk);
    p.w = rng.normal(nw);
    if (negative) {
      for (double& x : p.w) x = -std::abs(x);
    }
  }
  return p;
}

template <typename T>
IndexerProblem rounded(const IndexerProblem& p) {
  return {p.shape, rounded<T>(p.q), rounded<T>(p.k), rounded<T>(p.w)};
}

inline double head_dot(const IndexerProblem& p, int64_t row, int64_t head, int64_t s) {
  double d = 0;
  for (int64_t c = 0; c < p.shape.dim; ++c) {
    d += p.q[(row * p.shape.heads + head) * p.shape.dim + c] * p.k[s * p.shape.dim + c];
  }
  return d;
}

// I[t, s] = sum_j w[t, j] * ReLU(q[t, j] . k[s]).
inline double ref_index_score(const IndexerProblem& p, int64_t row, int64_t s) {
  double score = 0;
  for (int64_t j = 0; j < p.shape.heads; ++j) {
    score += p.w[row * p.shape.heads + j] * std::max(0.0, head_dot(p, row, j, s));
  }
  return score;
}

// The size of the terms summed into I[t, s], which bounds its rounding error.
inline double index_score_magnitude(const IndexerProblem& p, int64_t row, int64_t s) {
  double total = 0;
  for (int64_t j = 0; j < p.shape.heads; ++j) {
    double d = 0;
    for (int64_t c = 0; c < p.shape.dim; ++c) {
      d += std::abs(p.q[(row * p.shape.heads + j) * p.shape.dim + c] * p.k[s * p.shape.dim + c]);
    }
    total += std::abs(p.w[row * p.shape.heads + j]) * d;
  }
  return total;
}

// Row `row` of the full score table, over its visible keys.
inline std::vector<double> ref_score_row(const IndexerProblem& p, int64_t row) {
  std::vector<double> scores(p.shape.visible_keys(row));
  for (int64_t s = 0; s < static_cast<int64_t>(scores.size()); ++s) {
    scores[s] = ref_index_score(p, row, s);
  }
  return scores;
}

// The reference selection of one row: sort all visible keys by (score desc, index asc), keep
// min(topk, visible) in key order, pad with -1.
inline std::vector<int32_t> ref_topk_row(const std::vector<double>& scores, int64_t topk) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  const int64_t selected = std::min<int64_t>(topk, order.size());
  std::sort(order.begin(), order.begin() + selected);
  order.resize(topk, -1);
  return order;
}

// Analytic gradients of sum_{t,i} g[t,i] * I[t, indices[t,i]] (slots with -1 excluded).
struct IndexerGrads {
  std::vector<double> q, k, w;
};

inline IndexerGrads ref_index_score_backward(const IndexerProblem& p,
                                             const std::vector<int32_t>& indices, int64_t topk,
                                             const std::vector<double>& grad_scores) {
  const IndexerShape& s = p.shape;
  IndexerGrads g{std::vector<double>(p.q.size()), std::vector<double>(p.k.size()),
                 std::vector<double>(p.w.size())};
  for (int64_t t = 0; t < s.num_queries; ++t) {
    for (int64_t i = 0; i < topk; ++i) {
      const int32_t key = indices[t * topk + i];
      if (key < 0) continue;
      const double gs = grad_scores[t * topk + i];
      for (int64_t j = 0; j < s.heads; ++j) {
        const double d = head_dot(p, t, j, key);
        if (d <= 0) continue;
        const double wj = p.w[t * s.heads + j];
        g.w[t * s.heads + j] += gs * d;
        for (int64_t c = 0; c < s.dim; ++c) {
          g.q[(t * s.heads + j) * s.dim + c] += gs * wj * p.k[key * s.dim + c];
          g.k[key * s.dim + c] += gs * wj * p.q[(t * s.heads + j) * s.dim + c];
        }
      }
    }
  }
  return g;
}

// ---- Sparse attention ----

struct AttnProblem {
  SparseAttnShape shape;
  double scale = 1;
  std::vector<double> q, key, value;  // [N, H, d_qk], [M, d_qk], [M, d_v]
  std::vector<int32_t> indices;       // [N, topk]
};

inline std::string describe(const SparseAttnShape& s) {
  return "N=" + std::to_string(s.num_queries) + " M=" + std::to_string(s.num_keys) +
         " H=" + std::to_string(s.heads) + " d_qk=" + std::to_string(s.dim_qk) +
         " d_v=" + std::to_string(s.dim_v) + " topk=" + std::to_string(s.topk);
}

// Random indices: mostly valid keys, some -1 slots, duplicates allowed, and now and then a row
// with no valid slot at all.
inline std::vector<int32_t> random_indices(Random& rng, int64_t rows, int64_t topk,
                                           int64_t num_keys) {
  std::vector<int32_t> indices(rows * topk);
  for (int64_t r = 0; r < rows; ++r) {
    const bool empty_row = num_keys == 0 || rng.chance(0.1);
    for (int64_t i = 0; i < topk; ++i) {
      indices[r * topk + i] = empty_row || rng.chance(0.15)
                                  ? -1
                                  : static_cast<int32_t>(rng.uniform_int(0, num_keys - 1));
    }
  }
  return indices;
}

// Indices where a few keys are selected by very many rows (long per-key lists, where the order of
// accumulation matters) and the rest spread over all keys (many key chunks to parallelise).
inline std::vector<int32_t> clustered_indices(Random& rng, int64_t rows, int64_t topk,
                                              int64_t num_keys) {
  std::vector<int32_t> indices(rows * topk);
  for (int32_t& s : indices) {
    const double u = rng.uniform(0, 1);
    s = static_cast<int32_t>(u < 0.1   ? -1
                             : u < 0.6 ? rng.uniform_int(0, 3)
                                       : rng.uniform_int(0, num_keys - 1));
  }
  return indices;
}

// Odd sizes growing with max_size; more slots than keys at times (so duplicates).
inline AttnProblem random_attn_problem(Random& rng, int64_t max_size) {
  AttnProblem p;
  SparseAttnShape& s = p.shape;
  s.num_queries = rng.uniform_int(1, max_size);
  s.num_keys = rng.uniform_int(1, max_size + 10);
  s.heads = rng.uniform_int(1, 4);
  s.dim_qk = rng.uniform_int(1, max_size + 6);
  s.dim_v = rng.uniform_int(1, max_size);
  s.topk = rng.uniform_int(1, max_size + 8);
  p.scale = 1 / std::sqrt(static_cast<double>(s.dim_qk)) * rng.uniform(0.5, 2);
  p.q = rng.normal(s.num_queries * s.heads * s.dim_qk);
  p.key = rng.normal(s.num_keys * s.dim_qk);
  p.value = rng.normal(s.num_keys * s.dim_v);
  p.indices = random_indices(rng, s.num_queries, s.topk, s.num_keys);
  return p;
}

template <typename T>
AttnProblem rounded(const AttnProblem& p) {
  return {p.shape,
          static_cast<double>(static_cast<T>(p.scale)),
          rounded<T>(p.q),
          rounded<T>(p.key),
          rounded<T>(p.value),
          p.indices};
}

// Softmax probabilities of head h of row t over its slots (0 in unused slots), and their lse.
inline std::vector<double> ref_probs(const AttnProblem& p, int64_t t, int64_t h, double* lse) {
  const SparseAttnShape& s = p.shape;
  std::vector<double> logits(s.topk, -kInf);
  for (int64_t i = 0; i < s.topk; ++i) {
    const int32_t key = p.indices[t * s.topk + i];
    if (key < 0) continue;
    double d = 0;
    for (int64_t c = 0; c < s.dim_qk; ++c) {
      d += p.q[(t * s.heads + h) * s.dim_qk + c] * p.key[key * s.dim_qk + c];
    }
    logits[i] = p.scale * d;
  }
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(s.topk, 0.0);
  if (max_logit == -kInf) {
    *lse = -kInf;
    return probs;
  }
  double sum = 0;
  for (double l : logits) sum += std::exp(l - max_logit);
  *lse = max_logit + std::log(sum);
  for (int64_t i = 0; i < s.topk; ++i) probs[i] = std::exp(logits[i] - *lse);
  return probs;
}

struct AttnOutputs {
  std::vector<double> out, lse;  // [N, H, d_v], [N, H]
};

inline AttnOutputs ref_sparse_attn(const AttnProblem& p) {
  const SparseAttnShape& s = p.shape;
  AttnOutputs r{std::vector<double>(s.num_queries * s.heads * s.dim_v),
                std::vector<double>(s.num_queries * s.heads)};
  for (int64_t t = 0; t < s.num_queries; ++t) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const auto probs = ref_probs(p, t, h, &r.lse[t * s.heads + h]);
      for (int64_t i = 0; i < s.topk; ++i) {
        const int32_t key = p.indices[t * s.topk + i];
        if (key < 0) continue;
        for (int64_t c = 0; c < s.dim_v; ++c) {
          r.out[(t * s.heads + h) * s.dim_v + c] += probs[i] * p.value[key * s.dim_v + c];
        }
      }
    }
  }
  return r;
}

struct AttnGrads {
  std::vector<double> q, key, value;
};

// Gradients of sum(out * grad_out), straight from the softmax Jacobian:
// d logit_i = p_i * (dO . v_i - sum_j p_j dO . v_j).
inline AttnGrads ref_sparse_attn_backward(const AttnProblem& p,
                                          const std::vector<double>& grad_out) {
  const SparseAttnShape& s = p.shape;
  AttnGrads g{std::vector<double>(p.q.size()), std::vector<double>(p.key.size()),
              std::vector<double>(p.value.size())};
  for (int64_t t = 0; t < s.num_queries; ++t) {
    for (int64_t h = 0; h < s.heads; ++h) {
      double lse;
      const auto probs = ref_probs(p, t, h, &lse);
      const double* d_out = grad_out.data() + (t * s.heads + h) * s.dim_v;
      std::vector<double> dp(s.topk, 0.0);
      double mean_dp = 0;
      for (int64_t i = 0; i < s.topk; ++i) {
        const int32_t key = p.indices[t * s.topk + i];
        if (key < 0) continue;
        for (int64_t c = 0; c < s.dim_v; ++c) dp[i] += d_out[c] * p.value[key * s.dim_v + c];
        mean_dp += probs[i] * dp[i];
      }
      for (int64_t i = 0; i < s.topk; ++i) {
        const int32_t key = p.indices[t * s.topk + i];
        if (key < 0) continue;
        const double dlogit = probs[i] * (dp[i] - mean_dp);
        for (int64_t c = 0; c < s.dim_qk; ++c) {
          g.q[(t * s.heads + h) * s.dim_qk + c] += p.scale * dlogit * p.key[key * s.dim_qk + c];
          g.key[key * s.dim_qk + c] += p.scale * dlogit * p.q[(t * s.heads + h) * s.dim_qk + c];
        }
        for (int64_t c = 0; c < s.dim_v; ++c) g.value[key * s.dim_v + c] += probs[i] * d_out[c];
      }
    }
  }
  return g;
}

// Attention probabilities at the selected slots summed over heads, L1-normalised per row.
inline std::vector<double> ref_selected_mass(const AttnProblem& p) {
  const SparseAttnShape& s = p.shape;
  std::vector<double> mass(s.num_queries * s.topk, 0.0);
  for (int64_t t = 0; t < s.num_queries; ++t) {
    for (int64_t h = 0; h < s.heads; ++h) {
      double lse;
      const auto probs = ref_probs(p, t, h, &lse);
      for (int64_t i = 0; i < s.topk; ++i) mass[t * s.topk + i] += probs[i];
    }
    const double total =
        std::accumulate(mass.begin() + t * s.topk, mass.begin() + (t + 1) * s.topk, 0.0);
    if (total == 0) continue;
    for (int64_t i = 0; i < s.topk; ++i) mass[t * s.topk + i] /= total;
  }
  return mass;
}

}  // namespace hyscale::test
