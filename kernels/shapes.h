// Shapes and the key-visibility rule shared by every HyScale kernel.
//
// All tensors are dense, row-major and contiguous. Shapes are validated at the kernel boundary
// (validate() throws std::invalid_argument naming the offending field); kernel bodies trust them.
#pragma once

#include <cstdint>

namespace hyscale {

// Key s covers tokens [s*m, s*m + m) and is visible to the query at global position t when
// s*m + m - 1 <= t. m = 1 is DSA (one key per token); m > 1 is compressed / block selection
// (DeepSeek-V4 CSA, NSA). Kept as a parameter so no kernel assumes one key per token.
struct KeyVisibility {
  int64_t tokens_per_key = 1;

  // Number of keys visible to the query at global position t, given num_keys keys in total:
  // keys 0 .. visible_keys(t) - 1 are visible, the rest are not.
  int64_t visible_keys(int64_t t, int64_t num_keys) const {
    const int64_t v = (t + 1) / tokens_per_key;
    return v < 0 ? 0 : (v < num_keys ? v : num_keys);
  }

  // The first global position that sees key s.
  int64_t first_position(int64_t s) const { return s * tokens_per_key + tokens_per_key - 1; }
};

// Lightning-indexer problem: q [N, H_I, d_I], k [M, d_I], w [N, H_I].
// Score I[t, s] = sum_j w[t, j] * ReLU(q[t, j] . k[s]) for visible s; query row r has global
// position t = q_offset + r (q_offset places a sequence shard for context parallelism).
struct IndexerShape {
  int64_t num_queries = 0;  // N
  int64_t num_keys = 0;     // M
  int64_t heads = 0;        // H_I
  int64_t dim = 0;          // d_I
  int64_t q_offset = 0;
  KeyVisibility visibility;

  int64_t position(int64_t row) const { return q_offset + row; }
  int64_t visible_keys(int64_t row) const {
    return visibility.visible_keys(position(row), num_keys);
  }
  void validate() const;
};

// The dense indexer loss (the warm-up stage): the frozen main attention's q [N, H, d_qk] and
// key [M, d_qk] against every visible key, and the lightning indexer on the same queries and keys.
// indexer gives N, M, the visibility and q_offset to both.
struct DenseIndexerShape {
  IndexerShape indexer;
  int64_t heads = 0;  // H
  int64_t dim_qk = 0;

  void validate() const;
};

// Sparse MQA attention: q [N, H, d_qk], key [M, d_qk], value [M, d_v], indices [N, topk].
struct SparseAttnShape {
  int64_t num_queries = 0;  // N
  int64_t num_keys = 0;     // M
  int64_t heads = 0;        // H
  int64_t dim_qk = 0;
  int64_t dim_v = 0;
  int64_t topk = 0;

  void validate() const;
};

// How many CPU threads a kernel may use. Work is split into fixed-size chunks that do not depend
// on the thread count, so results are bit-identical for any value.
struct CpuContext {
  int threads = 1;
};

}  // namespace hyscale
