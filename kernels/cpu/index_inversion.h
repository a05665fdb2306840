// Inverts a selection indices[N, topk] into, for every key, the (row, slot) entries that chose
// it, ordered by row then slot (CSR). Backward kernels accumulate per key over this list, in
// parallel over keys and in a fixed order: deterministic for any thread count, no atomics.
#pragma once

#include <cstdint>
#include <vector>

namespace hyscale::cpu {

struct KeyToEntries {
  std::vector<int64_t> offsets;  // [num_keys + 1]
  std::vector<int64_t> entries;  // row * topk + slot, grouped by key

  KeyToEntries(const int32_t* indices, int64_t rows, int64_t topk, int64_t num_keys)
      : offsets(num_keys + 1, 0) {
    const int64_t n = rows * topk;
    for (int64_t e = 0; e < n; ++e) {
      if (indices[e] >= 0) ++offsets[indices[e] + 1];
    }
    for (int64_t s = 0; s < num_keys; ++s) offsets[s + 1] += offsets[s];
    entries.resize(offsets[num_keys]);
    std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
    for (int64_t e = 0; e < n; ++e) {
      if (indices[e] >= 0) entries[fill[indices[e]]++] = e;
    }
  }
};

}  // namespace hyscale::cpu
