// CPU FlashTopK: per query row, stream the visible keys, score each, keep a running top-k.
//
// Exactness: a buffer holds at most 2k candidates; when full it is cut to the k best with
// nth_element and the k-th best score becomes the admission threshold. Keys arrive in increasing
// index order, so a later key with a score equal to the threshold loses the tie (lower index
// wins) and is rejected; only strictly greater scores enter. Memory: O(k) per thread.
#include "kernels/flash_topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/index_score_row.h"
#include "kernels/cpu/parallel.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 8;

template <typename T>
struct Candidate {
  T score;
  int32_t index;
};

// Higher score first; equal scores: lower key index first.
template <typename T>
bool ranks_before(const Candidate<T>& a, const Candidate<T>& b) {
  return a.score > b.score || (a.score == b.score && a.index < b.index);
}

template <typename T>
class RunningTopK {
 public:
  explicit RunningTopK(int64_t k) : k_(k) { buffer_.reserve(2 * k); }

  void reset() {
    buffer_.clear();
    pruned_ = false;
  }

  void offer(T score, int32_t index) {
    if (std::isnan(score)) score = -std::numeric_limits<T>::infinity();
    if (pruned_ && !(score > threshold_)) return;
    buffer_.push_back({score, index});
    if (static_cast<int64_t>(buffer_.size()) == 2 * k_) prune();
  }

  // Writes the selection sorted best first; unused slots get -1 / -infinity.
  void write(int32_t* indices, T* scores) {
    std::sort(buffer_.begin(), buffer_.end(), ranks_before<T>);
    const int64_t n = std::min<int64_t>(k_, buffer_.size());
    for (int64_t i = 0; i < k_; ++i) {
      indices[i] = i < n ? buffer_[i].index : -1;
      scores[i] = i < n ? buffer_[i].score : -std::numeric_limits<T>::infinity();
    }
  }

 private:
  void prune() {
    std::nth_element(buffer_.begin(), buffer_.begin() + (k_ - 1), buffer_.end(), ranks_before<T>);
    buffer_.resize(k_);
    threshold_ = buffer_[k_ - 1].score;
    pruned_ = true;
  }

  int64_t k_;
  std::vector<Candidate<T>> buffer_;
  bool pruned_ = false;
  T threshold_ = 0;
};

}  // namespace

template <typename T>
void flash_topk_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w, int64_t topk,
                    int32_t* indices, T* scores, const CpuContext& ctx) {
  shape.validate();
  if (topk <= 0) throw std::invalid_argument("flash_topk: topk must be > 0");
  const int64_t heads = shape.heads, dim = shape.dim;
  cpu::parallel_for(0, shape.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    RunningTopK<T> top(topk);
    for (int64_t row = lo; row < hi; ++row) {
      top.reset();
      const T* q_row = q + row * heads * dim;
      const T* w_row = w + row * heads;
      const int64_t visible = shape.visible_keys(row);
      for (int64_t s = 0; s < visible; ++s) {
        top.offer(cpu::index_score(q_row, k + s * dim, w_row, heads, dim), static_cast<int32_t>(s));
      }
      top.write(indices + row * topk, scores + row * topk);
    }
  });
}

template void flash_topk_cpu<float>(const IndexerShape&, const float*, const float*, const float*,
                                    int64_t, int32_t*, float*, const CpuContext&);
template void flash_topk_cpu<double>(const IndexerShape&, const double*, const double*,
                                     const double*, int64_t, int32_t*, double*,
                                     const CpuContext&);

}  // namespace hyscale
