// The lightning-indexer score of one (query row, key) pair, shared by selection, gather and
// backward: I = sum_j w[j] * ReLU(q[j] . k).
#pragma once

#include <cstdint>

#include "kernels/cpu/dot.h"

namespace hyscale::cpu {

template <typename T>
inline T index_score(const T* q_row, const T* key, const T* w_row, int64_t heads, int64_t dim) {
  T total = 0;
  for (int64_t j = 0; j < heads; ++j) {
    const T d = dot(q_row + j * dim, key, dim);
    if (d > 0) total += w_row[j] * d;
  }
  return total;
}

}  // namespace hyscale::cpu
