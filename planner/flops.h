// The FLOP counts behind the device profile's rates (profile.h), shared by the cost model and the
// calibration tool (worker/calibrate): a measured rate must divide the same count the model
// multiplies. Header-only and dependency-free, so the tool need not link the planner.
#pragma once

namespace hyscale::server::planner {

// Attention backward / forward FLOPs: 2H(3 d_qk + 2 d_v) / 2H(d_qk + d_v) = 2.53 at 576 / 512.
inline constexpr double kBackwardFlops = 2.5;

// (query, key) pairs a causal sequence of n tokens scores: sum of (t + 1).
inline double CausalPairs(double n) {
  return n * (n + 1) / 2;
}

// Lightning-indexer scoring (FlashTopK or the score table): 2 H_I d_I per scored pair.
inline double SelectionFlops(double indexer_heads, double indexer_dim, double pairs) {
  return 2 * indexer_heads * indexer_dim * pairs;
}

// Attention forward over `pairs` (query, key) pairs: Q.K and P.V for every head.
inline double AttentionFlops(double heads, double dim_qk, double dim_v, double pairs) {
  return 2 * heads * (dim_qk + dim_v) * pairs;
}

// The indexer loss's target, the attention mass at the selected keys: Q.K for every head at each
// of `slots` (query, selected key) slots, k a query (no P.V: only the probabilities are kept).
inline double IndexerMassFlops(double heads, double dim_qk, double slots) {
  return 2 * heads * dim_qk * slots;
}

// The index scores' backward at `slots` selected entries: the grads of q_I and k_I, 2 H_I d_I each
// per slot. The kernel also recomputes the scores (for the ReLU gates and grad_w); the measured
// rate absorbs that.
inline double IndexScoreBackwardFlops(double indexer_heads, double indexer_dim, double slots) {
  return 4 * indexer_heads * indexer_dim * slots;
}

// The dense warm-up's indexer loss (dense_indexer_kl) over `pairs` (query, visible key) pairs:
// the frozen attention's logits Q.K for every head (2 H d_qk), the index scores (2 H_I d_I) and
// their backward (4 H_I d_I: the grads of q_I and k_I, from the ReLU gates the scores pass kept).
// The target's softmax, the KL and the passes over the fp32 tables are not counted: the measured
// rate absorbs them.
inline double DenseIndexerLossFlops(double heads, double dim_qk, double indexer_heads,
                                    double indexer_dim, double pairs) {
  return pairs * (2 * heads * dim_qk + 6 * indexer_heads * indexer_dim);
}

}  // namespace hyscale::server::planner
