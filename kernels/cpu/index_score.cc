// CPU index scores at selected entries (selection replay) and their backward.
//
// Backward in two phases. Per row (parallel over rows): grad_q and grad_w from the row's own
// slots, recomputing q . k per (slot, head) and recording the ReLU gates [q[t, j] . k[s] > 0] as
// bits. Per key (parallel over keys, through the CSR inversion): grad_k from the entries that
// selected the key, in (row, slot) order, reusing the recorded gates, so both phases agree on
// every gate, and the gates are those of the forward scores (same bits, see row_tile.h).
#include "kernels/index_score.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/index_inversion.h"
#include "kernels/cpu/index_score_tile.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_tile.h"

namespace hyscale {
namespace {

constexpr int64_t kRowsPerChunk = 16;
constexpr int64_t kKeysPerChunk = 64;

// One bit per (entry, head), entry = row * topk + slot; an entry's words are its own, so rows
// processed by different threads never share a word.
class GateBits {
 public:
  GateBits(int64_t entries, int64_t heads)
      : words_per_entry_((heads + 63) / 64), words_(entries * words_per_entry_, 0) {}

  void set(int64_t entry, int64_t head) { words_[word(entry, head)] |= bit(head); }
  bool test(int64_t entry, int64_t head) const { return words_[word(entry, head)] & bit(head); }

 private:
  int64_t word(int64_t entry, int64_t head) const { return entry * words_per_entry_ + head / 64; }
  static uint64_t bit(int64_t head) { return uint64_t{1} << (head % 64); }

  int64_t words_per_entry_;
  std::vector<uint64_t> words_;
};

}  // namespace

void validate_indices(const IndexerShape& shape, const int32_t* indices, int64_t topk) {
  shape.validate();
  for (int64_t row = 0; row < shape.num_queries; ++row) {
    const int64_t visible = shape.visible_keys(row);
    for (int64_t i = 0; i < topk; ++i) {
      const int64_t s = indices[row * topk + i];
      if (s != -1 && (s < 0 || s >= visible)) {
        throw std::invalid_argument("indices[" + std::to_string(row) + ", " + std::to_string(i) +
                                    "] = " + std::to_string(s) + " is not a key visible to row " +
                                    std::to_string(row) + " (visible: 0.." +
                                    std::to_string(visible - 1) + ", or -1)");
      }
    }
  }
}

template <typename T>
void index_score_gather_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w,
                            const int32_t* indices, int64_t topk, T* scores,
                            const CpuContext& ctx) {
  shape.validate();
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  const int64_t heads = shape.heads, dim = shape.dim;
  cpu::parallel_for(0, shape.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(dim);
    T tile_scores[kTile];
    for (int64_t row = lo; row < hi; ++row) {
      const int32_t* idx_row = indices + row * topk;
      T* score_row = scores + row * topk;
      for (int64_t first = 0; first < topk; first += kTile) {
        const int64_t count = std::min(kTile, topk - first);
        keys.load_rows(k, idx_row + first, count);
        cpu::index_scores(q + row * heads * dim, w + row * heads, keys, heads, tile_scores);
        for (int64_t lane = 0; lane < count; ++lane) {
          score_row[first + lane] =
              idx_row[first + lane] < 0 ? -std::numeric_limits<T>::infinity() : tile_scores[lane];
        }
      }
    }
  });
}

template <typename T>
void index_score_backward_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w,
                              const int32_t* indices, int64_t topk, const T* grad_scores, T* grad_q,
                              T* grad_k, T* grad_w, const CpuContext& ctx) {
  shape.validate();
  constexpr int64_t kTile = cpu::RowTile<T>::kWidth;
  const int64_t heads = shape.heads, dim = shape.dim;
  const cpu::KeySelections selections(indices, shape.num_queries, topk, shape.num_keys);
  GateBits gates(shape.num_queries * topk, heads);

  // grad_q[t, j] = sum_i g[t, i] * w[t, j] * gate * k[s_i];  grad_w[t, j] = sum_i g[t, i] *
  // ReLU(d).
  cpu::parallel_for(0, shape.num_queries, kRowsPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    cpu::RowTile<T> keys(dim);
    T dots[kTile];
    for (int64_t row = lo; row < hi; ++row) {
      const int32_t* idx_row = indices + row * topk;
      const T* q_row = q + row * heads * dim;
      T* gq = grad_q + row * heads * dim;
      T* gw = grad_w + row * heads;
      std::fill(gq, gq + heads * dim, T(0));
      std::fill(gw, gw + heads, T(0));
      for (int64_t first = 0; first < topk; first += kTile) {
        const int64_t count = std::min(kTile, topk - first);
        keys.load_rows(k, idx_row + first, count);
        for (int64_t j = 0; j < heads; ++j) {
          keys.dots(q_row + j * dim, dots);
          for (int64_t lane = 0; lane < count; ++lane) {
            const int64_t entry = row * topk + first + lane;
            const int32_t s = indices[entry];
            if (s < 0 || !(dots[lane] > 0)) continue;
            gates.set(entry, j);
            const T g = grad_scores[entry];
            gw[j] += g * dots[lane];
            cpu::axpy(g * w[row * heads + j], k + s * dim, gq + j * dim, dim);
          }
        }
      }
    }
  });

  // grad_k[s] = sum over entries (t, i) selecting s of g[t, i] * sum_j w[t, j] * gate * q[t, j].
  cpu::parallel_for(0, shape.num_keys, kKeysPerChunk, ctx, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      T* gk = grad_k + s * dim;
      std::fill(gk, gk + dim, T(0));
      for (const int64_t entry : selections.of_key(s)) {
        const int64_t row = entry / topk;
        for (int64_t j = 0; j < heads; ++j) {
          if (!gates.test(entry, j)) continue;
          cpu::axpy(grad_scores[entry] * w[row * heads + j], q + (row * heads + j) * dim, gk, dim);
        }
      }
    }
  });
}

#define HYSCALE_INSTANTIATE(T)                                                                 \
  template void index_score_gather_cpu<T>(const IndexerShape&, const T*, const T*, const T*,   \
                                          const int32_t*, int64_t, T*, const CpuContext&);     \
  template void index_score_backward_cpu<T>(const IndexerShape&, const T*, const T*, const T*, \
                                            const int32_t*, int64_t, const T*, T*, T*, T*,     \
                                            const CpuContext&);
HYSCALE_INSTANTIATE(float)
HYSCALE_INSTANTIATE(double)
#undef HYSCALE_INSTANTIATE

}  // namespace hyscale
