// Inverts a selection indices [rows, topk] into, for every key, the entries (row * topk + slot)
// that selected it, ordered by row then slot (CSR). Backward kernels accumulate each key's
// gradient over its list, in parallel over keys and always in this order: deterministic for any
// thread count, no atomics, no per-thread copies of the key gradients.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hyscale::cpu {

class KeySelections {
 public:
  // Entries with index -1 (unused slots) are skipped. Any other index outside [0, num_keys)
  // throws std::invalid_argument: it would otherwise be written out of bounds.
  KeySelections(const int32_t* indices, int64_t rows, int64_t topk, int64_t num_keys)
      : offsets_(num_keys + 1, 0) {
    const int64_t n = rows * topk;
    for (int64_t e = 0; e < n; ++e) {
      const int64_t s = indices[e];
      if (s < -1 || s >= num_keys) {
        throw std::invalid_argument("indices[" + std::to_string(e / topk) + ", " +
                                    std::to_string(e % topk) + "] = " + std::to_string(s) +
                                    " is outside [0, " + std::to_string(num_keys) + ") and not -1");
      }
      if (s >= 0) ++offsets_[s + 1];
    }
    for (int64_t s = 0; s < num_keys; ++s) offsets_[s + 1] += offsets_[s];
    entries_.resize(offsets_[num_keys]);
    std::vector<int64_t> next(offsets_.begin(), offsets_.end() - 1);
    for (int64_t e = 0; e < n; ++e) {
      if (indices[e] >= 0) entries_[next[indices[e]]++] = e;
    }
  }

  struct Entries {
    const int64_t* first;
    const int64_t* last;
    const int64_t* begin() const { return first; }
    const int64_t* end() const { return last; }
  };

  // The entries that selected key s, increasing (by row, then slot).
  Entries of_key(int64_t s) const {
    return {entries_.data() + offsets_[s], entries_.data() + offsets_[s + 1]};
  }

 private:
  std::vector<int64_t> offsets_;  // [num_keys + 1]
  std::vector<int64_t> entries_;  // grouped by key
};

}  // namespace hyscale::cpu
