// A tile of up to kWidth rows of a row-major [rows, dim] matrix, stored transposed (dim-major) so
// that the dot products of one vector with every row of the tile run across SIMD lanes (simd.h):
// no horizontal sums, no -ffast-math needed.
//
// Each lane sums over d in order 0 .. dim-1, independently of the other lanes, so the dot product
// of a given vector and row has the same bits whichever tile and lane the row lands in. That is
// what makes flash_topk's scores and index_score_gather's recomputed scores bit-identical.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd.h"

namespace hyscale::cpu {

template <typename T>
class RowTile {
 public:
  // 16 lanes: 4 (float) or 8 (double) independent vector accumulators, enough to hide the
  // latency of the adds.
  static constexpr int64_t kWidth = 16;

  explicit RowTile(int64_t dim) : dim_(dim), data_(dim * kWidth) {}

  int64_t dim() const { return dim_; }

  // Loads rows first .. first + count - 1 (count <= kWidth).
  void load_range(const T* matrix, int64_t first, int64_t count) {
    for (int64_t lane = 0; lane < kWidth; ++lane) {
      set_lane(lane, lane < count ? matrix + (first + lane) * dim_ : nullptr);
    }
  }

  // Loads rows ids[0 .. count) (count <= kWidth); an id < 0 (an unused slot) loads zeros.
  void load_rows(const T* matrix, const int32_t* ids, int64_t count) {
    for (int64_t lane = 0; lane < kWidth; ++lane) {
      set_lane(lane, lane < count && ids[lane] >= 0 ? matrix + ids[lane] * dim_ : nullptr);
    }
  }

  // out[lane] = x . row[lane] for every lane (lanes without a row hold zeros).
  void dots(const T* x, T* out) const {
    using V = Simd<T>;
    constexpr int64_t kVecs = kWidth / V::kLanes;
    typename V::Vec acc[kVecs] = {};
    const T* column = data_.data();
    for (int64_t d = 0; d < dim_; ++d, column += kWidth) {
      for (int64_t v = 0; v < kVecs; ++v) acc[v] += x[d] * V::load(column + v * V::kLanes);
    }
    for (int64_t v = 0; v < kVecs; ++v) V::store(out + v * V::kLanes, acc[v]);
  }

 private:
  void set_lane(int64_t lane, const T* row) {
    for (int64_t d = 0; d < dim_; ++d) data_[d * kWidth + lane] = row ? row[d] : T(0);
  }

  int64_t dim_;
  std::vector<T> data_;  // [dim, kWidth]
};

// The causal walk of rows [lo, hi) over their visible keys (shape.visible_keys(row), growing
// with the row): each tile of `matrix`'s rows is loaded into `keys` once for all the rows, then
// row_fn(row, first, count) runs for each row that sees count > 0 of its keys from `first`.
template <typename T, class Shape, class RowFn>
void for_each_visible_tile(const Shape& shape, int64_t lo, int64_t hi, const T* matrix,
                           RowTile<T>& keys, RowFn&& row_fn) {
  constexpr int64_t kTile = RowTile<T>::kWidth;
  const int64_t chunk_visible = shape.visible_keys(hi - 1);
  for (int64_t first = 0; first < chunk_visible; first += kTile) {
    keys.load_range(matrix, first, std::min(kTile, chunk_visible - first));
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t count = std::min(kTile, shape.visible_keys(row) - first);
      if (count > 0) row_fn(row, first, count);
    }
  }
}

// y += alpha * x
template <typename T>
inline void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace hyscale::cpu
