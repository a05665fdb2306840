// The lightning-indexer score of one query row against every key of a tile:
//   scores[lane] = sum_j w[j] * ReLU(q[j] . key[lane]).
// Selection (flash_topk) and replay (index_score_gather) both score through here, so a replayed
// score has exactly the bits of the score it was selected with.
#pragma once

#include <cstdint>

#include "kernels/cpu/row_tile.h"
#include "kernels/cpu/simd.h"

namespace hyscale::cpu {

// q_row [heads, keys.dim()], w_row [heads], scores [RowTile<T>::kWidth].
template <typename T>
inline void index_scores(const T* q_row, const T* w_row, const RowTile<T>& keys, int64_t heads,
                         T* scores) {
  using V = Simd<T>;
  constexpr int64_t kVecs = RowTile<T>::kWidth / V::kLanes;
  typename V::Vec total[kVecs] = {};
  T dots[RowTile<T>::kWidth];
  for (int64_t j = 0; j < heads; ++j) {
    keys.dots(q_row + j * keys.dim(), dots);
    for (int64_t v = 0; v < kVecs; ++v) {
      const typename V::Vec d = V::load(dots + v * V::kLanes);
      total[v] += w_row[j] * (d > 0 ? d : 0);  // ReLU without a branch per lane
    }
  }
  for (int64_t v = 0; v < kVecs; ++v) V::store(scores + v * V::kLanes, total[v]);
}

}  // namespace hyscale::cpu
