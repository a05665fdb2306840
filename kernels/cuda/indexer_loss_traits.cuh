// Tiling of the indexer-loss kernels (indexer_loss.cu), in one place.
//
// index_score_backward runs one warpgroup per query row on tensor cores (wgmma, sm_90a) and walks
// the row's selected keys in tiles of 64, gathered into shared memory as flash_topk gathers them;
// the three products of a tile are m64 wgmmas (docs/sparse_attn.md, "The indexer's loss on the
// GPU").
#pragma once

#include "kernels/cuda/index_tile_traits.cuh"

namespace hyscale::cuda {

template <int kHeads_, int kDim_>
struct ScoreGradTraits {
  // The scores' product is flash_topk's (bf16), so the ReLU gates are the forward's bit for bit.
  using Tile = IndexTileTraits<kHeads_, kDim_>;
  static constexpr int kHeads = kHeads_;
  static constexpr int kDim = kDim_;
  static constexpr int kThreads = 128;  // one warpgroup
  static constexpr int kKeys = Tile::kKeysPerTile;
  static constexpr int kStages = 2;               // key tiles in flight
  static constexpr int kHeadSteps = kHeads / 16;  // k16 steps over heads (the key gradient's K)
  static constexpr int kKeySteps = kKeys / 16;    // k16 steps over keys (the query gradient's K)
  static constexpr int kDimBlocks = kDim / 64;    // m64 blocks of the query gradient (d in M)
  // fp32 key-gradient rows staged for the bulk reductions, padded by 8 floats: a warp's float2
  // stores of 8 rows then fall into distinct banks.
  static constexpr int kStageStride = kDim + 8;
  // Shared memory in bytes: the query tile [H_I x d_I], the key tiles [64 x d_I] and the gates'
  // coefficients [H_I x 64] (bf16, 1 KB-aligned swizzled tiles), the staging rows, and the slack
  // that aligns the first tile.
  static constexpr int kQueryBytes = kHeads * kDim * 2;
  static constexpr int kKeyTileBytes = kKeys * kDim * 2;
  static constexpr int kCoefBytes = kHeads * kKeys * 2;
  static constexpr int kStageBytes = kKeys * kStageStride * 4;
  static constexpr int kSmemBytes =
      1024 + kQueryBytes + kStages * kKeyTileBytes + kCoefBytes + kStageBytes;
  static_assert(kHeads % 16 == 0 && kDim % 64 == 0 && kCoefBytes % 1024 == 0,
                "unsupported indexer shape");
};

// The dense warm-up's target on tensor cores (dense_target.cu). A block takes 128 (row, head)
// pairs (128 / H rows) against a chunk of kKeyChunk keys, its Q [pairs x d_qk] resident in shared
// memory; consumer warpgroup w takes pairs 64 w .. 64 w + 63, and both read every 64-key tile,
// which the producer warpgroup streams a 64-column block at a time through a ring of kSlots slots.
// S^T [keys x pairs] = K_tile Q^T puts keys in M, so the sum over a row's heads is a sum over the
// accumulator's columns: in registers, then across a quad.
struct DenseTargetTraits {
  static constexpr int kThreads = 384;               // consumer warpgroups 0 and 1, producer 2
  static constexpr int kPairs = 128;                 // (row, head) pairs of a block
  static constexpr int kKeys = 64;                   // keys of a tile (wgmma's M)
  static constexpr int kKeyChunk = 2048;             // keys of a block: 32 tiles
  static constexpr int kMaxDimQk = 576;              // Q of 128 pairs: 144 KB
  static constexpr int kSlotBytes = kKeys * 64 * 2;  // a tile's 64-column block (swizzled)
  static constexpr int kSlots = 10;
  static constexpr int kBarrierBytes = 1024;  // q_ready, full[kSlots], empty[kSlots]
  // Shared memory: 1 KB alignment slack, Q, the ring, the barriers.
  static constexpr int smem_bytes(int dim_qk) {
    return 1024 + kPairs * dim_qk * 2 + kSlots * kSlotBytes + kBarrierBytes;
  }
  static_assert(1024 + kPairs * kMaxDimQk * 2 + kSlots * kSlotBytes + kBarrierBytes <= 227 * 1024,
                "the widest Q and the ring fit an SM");
};

// The dense warm-up's visibility over a block of rows: row t (position first_position + t) sees
// keys s < visible(t), its causal prefix (kernels/shapes.h KeyVisibility); as a key source of the
// index-score backward, slot i of a row is key i.
struct PrefixKeys {
  int64_t first_position;  // row 0's position
  int64_t tokens_per_key;
  int64_t num_keys;  // the block's keys (the dense loss's [rows, keys] tables' row length)
  __device__ int64_t visible(int64_t t) const {
    const int64_t seen = (first_position + t + 1) / tokens_per_key;
    return seen < num_keys ? seen : num_keys;
  }
  // The first row that sees key s (every later row sees it too).
  __device__ int64_t first_row_seeing(int64_t s) const {
    const int64_t t = (s + 1) * tokens_per_key - 1 - first_position;
    return t > 0 ? t : 0;
  }
  struct Row {
    int64_t count;  // visible keys: the slots worth a tile
    __device__ int32_t key(int64_t slot) const {
      return slot < count ? static_cast<int32_t>(slot) : -1;
    }
  };
  __device__ Row row(int64_t t) const { return {visible(t)}; }
  __device__ int64_t stride() const { return num_keys; }
};

// indexer_kl: one warp per row.
struct RowWarpTraits {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / 32;
};

}  // namespace hyscale::cuda
