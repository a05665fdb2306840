// CPU FlashTopK: per query row, stream the visible keys, score each, keep a running top-k.
//
// A buffer holds at most 2k candidates; when it fills, nth_element cuts it to the k best and the
// k-th best score becomes the admission threshold, which only rises. Keys arrive in increasing
// index order, so a later key whose score equals the threshold would lose the tie (lower index
// wins): only strictly greater scores enter. Memory is O(k) per row in flight, never [N, M].
//
// Rows are processed in fixed chunks; a chunk loads each tile of keys once (transposed, see
// row_tile.h) and scores it against all of its rows.
#include "kernels/flash_topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/index_score_tile.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_tile.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 8;

template <typename T>
struct Candidate {
  T score;
  int32_t index;
};

// The rank that decides the selection (not its output order): higher score first; equal scores,
// lower key index first.
template <typename T>
bool ranks_before(const Candidate<T>& a, const Candidate<T>& b) {
  return a.score > b.score || (a.score == b.score && a.index < b.index);
}

template <typename T>
class RunningTopK {
 public:
  explicit RunningTopK(int64_t k) : k_(k) { buffer_.reserve(2 * k); }

  // Keys must be offered in increasing index order.
  void offer(T score, int32_t index) {
    if (std::isnan(score)) score = -std::numeric_limits<T>::infinity();  // keeps the order strict
    if (pruned_ && !(score > threshold_)) return;
    buffer_.push_back({score, index});
    if (static_cast<int64_t>(buffer_.size()) == 2 * k_) prune();
  }

  // Writes the selection in key order; unused slots get -1 / -infinity.
  void write(int32_t* indices, T* scores) {
    if (static_cast<int64_t>(buffer_.size()) > k_) prune();
    std::sort(buffer_.begin(), buffer_.end(),
              [](const Candidate<T>& a, const Candidate<T>& b) { return a.index < b.index; });
    const int64_t n = buffer_.size();
    for (int64_t i = 0; i < k_; ++i) {
      indices[i] = i < n ? buffer_[i].index : -1;
      scores[i] = i < n ? buffer_[i].score : -std::numeric_limits<T>::infinity();
    }
  }

 private:
  // Keeps the k best candidates.
  void prune() {
    std::nth_element(buffer_.begin(), buffer_.begin() + (k_ - 1), buffer_.end(), ranks_before<T>);
    buffer_.resize(k_);
    threshold_ = buffer_[k_ - 1].score;
    pruned_ = true;
  }

  int64_t k_;
  std::vector<Candidate<T>> buffer_;
  bool pruned_ = false;  // until the first prune every key enters
  T threshold_ = 0;
};

}  // namespace

template <typename T>
void flash_topk_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w, int64_t topk,
                    int32_t* indices, T* scores, const CpuContext& ctx) {
  shape.validate();
  if (topk <= 0) {
    throw std::invalid_argument("flash_topk: topk must be > 0 (got " + std::to_string(topk) + ")");
  }
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  const int64_t heads = shape.heads, dim = shape.dim;
  cpu::parallel_for(0, shape.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    std::vector<RunningTopK<T>> top;
    top.reserve(hi - lo);
    for (int64_t row = lo; row < hi; ++row) top.emplace_back(topk);
    cpu::RowTile<T> keys(dim);
    T tile_scores[kTile];
    cpu::for_each_visible_tile(
        shape, lo, hi, k, keys, [&](int64_t row, int64_t first, int64_t count) {
          cpu::index_scores(q + row * heads * dim, w + row * heads, keys, heads, tile_scores);
          for (int64_t lane = 0; lane < count; ++lane) {
            top[row - lo].offer(tile_scores[lane], static_cast<int32_t>(first + lane));
          }
        });
    for (int64_t row = lo; row < hi; ++row) {
      top[row - lo].write(indices + row * topk, scores + row * topk);
    }
  });
}

template void flash_topk_cpu<float>(const IndexerShape&, const float*, const float*, const float*,
                                    int64_t, int32_t*, float*, const CpuContext&);
template void flash_topk_cpu<double>(const IndexerShape&, const double*, const double*,
                                     const double*, int64_t, int32_t*, double*, const CpuContext&);

}  // namespace hyscale
