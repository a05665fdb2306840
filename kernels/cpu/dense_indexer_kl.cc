// CPU dense indexer loss: flash-style, one tile of keys at a time, never an [N, M] table.
//
// The log-sum-exps stream the visible keys once per row (online: a running maximum and a rescaled
// sum). The loss then makes two passes that recompute the same tiles (same bits, see row_tile.h).
// Per row (parallel over rows): the loss, grad_q and grad_w. Per key tile (parallel over key
// tiles): grad_k, summed over the rows that see the tile in row order. Splitting the sums this way
// keeps them in a fixed order for any thread count without atomics or per-thread copies, at the
// price of computing every (row, key) term twice, as FlashAttention's backward does for dK.
//
// Row chunks load each key tile once for all of their rows; tiles start at multiples of kWidth
// from key 0 in every pass, so a row's terms do not depend on its chunk.
#include "kernels/dense_indexer_kl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/index_score_tile.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_tile.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 8;

template <typename T>
constexpr T kMinusInf = -std::numeric_limits<T>::infinity();

// Log-sum-exp of values arriving a tile at a time.
template <typename T>
class OnlineLse {
 public:
  void add(const T* x, int64_t count) {
    const T tile_max = *std::max_element(x, x + count);
    if (tile_max > max_) {
      sum_ *= std::exp(max_ - tile_max);  // 0 * exp(-inf) = 0 on the first tile
      max_ = tile_max;
    }
    for (int64_t i = 0; i < count; ++i) sum_ += std::exp(x[i] - max_);
  }
  T value() const { return sum_ > 0 ? max_ + std::log(sum_) : kMinusInf<T>; }

 private:
  T max_ = kMinusInf<T>;
  T sum_ = 0;
};

// logits[h * kWidth + lane] = scale * q_row[h] . key[lane] for every head.
template <typename T>
void attention_logits(const T* q_row, int64_t heads, T scale, const cpu::RowTile<T>& keys,
                      T* logits) {
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  for (int64_t h = 0; h < heads; ++h) {
    T* l = logits + h * kTile;
    keys.dots(q_row + h * keys.dim(), l);
    for (int64_t lane = 0; lane < kTile; ++lane) l[lane] *= scale;
  }
}

template <typename T>
struct Inputs {
  const T *q, *key, *lse, *index_q, *index_k, *index_w, *index_lse;
  T scale;
};

// One row against one key tile of which `count` lanes are visible to it: writes grad[lane] =
// dKL/dI[t, s] = softmax(I[t])_s - p[t, s] and returns the lanes' share of the row's KL.
// `logits` is scratch of heads * kWidth.
template <typename T>
T kl_tile(const DenseIndexerShape& s, const Inputs<T>& in, int64_t row, const cpu::RowTile<T>& keys,
          const cpu::RowTile<T>& index_keys, int64_t count, T* logits, T* grad) {
  const int64_t heads = s.heads, index_heads = s.indexer.heads;
  const T* lse = in.lse + row * heads;
  attention_logits(in.q + row * heads * s.dim_qk, heads, in.scale, keys, logits);
  T scores[cpu::RowTile<T>::kWidth];
  cpu::index_scores(in.index_q + row * index_heads * s.indexer.dim, in.index_w + row * index_heads,
                    index_keys, index_heads, scores);
  T loss = 0;
  for (int64_t lane = 0; lane < count; ++lane) {
    T p = 0;
    for (int64_t h = 0; h < heads; ++h) {
      p += std::exp(logits[h * cpu::RowTile<T>::kWidth + lane] - lse[h]);
    }
    p /= static_cast<T>(heads);
    const T log_q = scores[lane] - in.index_lse[row];
    if (p > 0) loss += p * (std::log(p) - log_q);  // 0 log 0 = 0
    grad[lane] = std::exp(log_q) - p;
  }
  return loss;
}

}  // namespace

template <typename T>
void dense_attention_lse_cpu(const DenseIndexerShape& shape, const T* q, const T* key, T scale,
                             T* lse, const CpuContext& ctx) {
  shape.validate();
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  const IndexerShape& s = shape.indexer;
  const int64_t heads = shape.heads;
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(shape.dim_qk);
    std::vector<T> logits(heads * kTile);
    std::vector<OnlineLse<T>> sums((hi - lo) * heads);
    cpu::for_each_visible_tile(s, lo, hi, key, keys, [&](int64_t row, int64_t, int64_t count) {
      attention_logits(q + row * heads * shape.dim_qk, heads, scale, keys, logits.data());
      for (int64_t h = 0; h < heads; ++h) {
        sums[(row - lo) * heads + h].add(logits.data() + h * kTile, count);
      }
    });
    for (int64_t i = 0; i < (hi - lo) * heads; ++i) lse[lo * heads + i] = sums[i].value();
  });
}

template <typename T>
void dense_index_lse_cpu(const IndexerShape& s, const T* index_q, const T* index_k,
                         const T* index_w, T* index_lse, const CpuContext& ctx) {
  s.validate();
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(s.dim);
    T scores[kTile];
    std::vector<OnlineLse<T>> sums(hi - lo);
    cpu::for_each_visible_tile(s, lo, hi, index_k, keys, [&](int64_t row, int64_t, int64_t count) {
      cpu::index_scores(index_q + row * s.heads * s.dim, index_w + row * s.heads, keys, s.heads,
                        scores);
      sums[row - lo].add(scores, count);
    });
    for (int64_t row = lo; row < hi; ++row) index_lse[row] = sums[row - lo].value();
  });
}

template <typename T>
void dense_indexer_kl_cpu(const DenseIndexerShape& shape, const T* q, const T* key, T scale,
                          const T* lse, const T* index_q, const T* index_k, const T* index_w,
                          const T* index_lse, T* loss, T* grad_q, T* grad_k, T* grad_w,
                          const CpuContext& ctx) {
  shape.validate();
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  const IndexerShape& s = shape.indexer;
  const int64_t index_heads = s.heads, dim = s.dim;
  const Inputs<T> in{q, key, lse, index_q, index_k, index_w, index_lse, scale};

  // Per row: loss, grad_q[t, j] = sum_s g * w[t, j] * gate * k[s], grad_w[t, j] = sum_s g * ReLU.
  cpu::parallel_for(0, s.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(shape.dim_qk), index_keys(dim);
    std::vector<T> logits(shape.heads * kTile);
    T grad[kTile], dots[kTile];
    std::fill(loss + lo, loss + hi, T(0));
    std::fill(grad_q + lo * index_heads * dim, grad_q + hi * index_heads * dim, T(0));
    std::fill(grad_w + lo * index_heads, grad_w + hi * index_heads, T(0));
    const int64_t chunk_visible = s.visible_keys(hi - 1);
    for (int64_t first = 0; first < chunk_visible; first += kTile) {
      const int64_t loaded = std::min(kTile, chunk_visible - first);
      keys.load_range(key, first, loaded);
      index_keys.load_range(index_k, first, loaded);
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t count = std::min(kTile, s.visible_keys(row) - first);
        if (count <= 0) continue;
        loss[row] += kl_tile(shape, in, row, keys, index_keys, count, logits.data(), grad);
        for (int64_t j = 0; j < index_heads; ++j) {
          const int64_t qj = row * index_heads + j;
          index_keys.dots(index_q + qj * dim, dots);
          for (int64_t lane = 0; lane < count; ++lane) {
            if (!(dots[lane] > 0)) continue;
            grad_w[qj] += grad[lane] * dots[lane];
            cpu::axpy(grad[lane] * index_w[qj], index_k + (first + lane) * dim, grad_q + qj * dim,
                      dim);
          }
        }
      }
    }
  });

  // Per key tile: grad_k[s] = sum_t g * sum_j w[t, j] * gate * q[t, j], rows in increasing order.
  cpu::parallel_for(0, s.num_keys, kTile, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(shape.dim_qk), index_keys(dim);
    std::vector<T> logits(shape.heads * kTile);
    T grad[kTile], dots[kTile];
    keys.load_range(key, lo, hi - lo);
    index_keys.load_range(index_k, lo, hi - lo);
    std::fill(grad_k + lo * dim, grad_k + hi * dim, T(0));
    const int64_t first_row = std::max<int64_t>(0, s.visibility.first_position(lo) - s.q_offset);
    for (int64_t row = first_row; row < s.num_queries; ++row) {
      const int64_t count = std::min(hi - lo, s.visible_keys(row) - lo);
      kl_tile(shape, in, row, keys, index_keys, count, logits.data(), grad);
      for (int64_t j = 0; j < index_heads; ++j) {
        const T* q_j = index_q + (row * index_heads + j) * dim;
        index_keys.dots(q_j, dots);
        for (int64_t lane = 0; lane < count; ++lane) {
          if (!(dots[lane] > 0)) continue;
          cpu::axpy(grad[lane] * index_w[row * index_heads + j], q_j, grad_k + (lo + lane) * dim,
                    dim);
        }
      }
    }
  });
}

#define HYSCALE_INSTANTIATE(T)                                                                     \
  template void dense_attention_lse_cpu<T>(const DenseIndexerShape&, const T*, const T*, T, T*,    \
                                           const CpuContext&);                                     \
  template void dense_index_lse_cpu<T>(const IndexerShape&, const T*, const T*, const T*, T*,      \
                                       const CpuContext&);                                         \
  template void dense_indexer_kl_cpu<T>(const DenseIndexerShape&, const T*, const T*, T, const T*, \
                                        const T*, const T*, const T*, const T*, T*, T*, T*, T*,    \
                                        const CpuContext&);
HYSCALE_INSTANTIATE(float)
HYSCALE_INSTANTIATE(double)
#undef HYSCALE_INSTANTIATE

}  // namespace hyscale
