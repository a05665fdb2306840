// Tiling of the indexer-loss kernels (indexer_loss.cu), in one place.
//
// The gather kernel runs one block per query row and walks the row's selected keys in tiles of 32,
// one key per lane: a tile's keys are gathered
// into shared memory as fp32 rows padded by 4 floats, so each lane reads its own key row 16 bytes
// at a time without bank conflicts while the query rows are broadcast. Products run on CUDA cores
// in fp32.
#pragma once

namespace hyscale::cuda {

struct GatherTileTraits {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kKeys = 32;  // keys per tile: one per lane
  static constexpr int kPad = 4;    // floats of padding per shared row (16 bytes)
};

// index_score_backward: one block per query row, all H_I heads; warp w owns heads w, w + 8, ...
template <int kHeads_, int kDim_>
struct ScoreGradTraits : GatherTileTraits {
  static constexpr int kHeads = kHeads_;
  static constexpr int kDim = kDim_;
  static constexpr int kStride = kDim + kPad;
  static constexpr int kHeadsPerWarp = kHeads / kWarps;  // grad_q rows and dots per thread
  static constexpr int kDimsPerLane = kDim / 32;         // grad_q / grad_k columns per thread
  static constexpr int kKeysPerWarp = kKeys / kWarps;    // grad_k rows per warp
  // Shared floats: the query's heads, a key tile, and the tile's coefficients [heads, keys].
  static constexpr int kSmemFloats = kHeads * kStride + kKeys * kStride + kHeads * kKeys;
  static_assert(kHeads % kWarps == 0 && kDim % 32 == 0, "unsupported indexer shape");
};

// indexer_kl: one warp per row.
struct RowWarpTraits {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / 32;
};

}  // namespace hyscale::cuda
