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
  static constexpr int kSlotTiles = 3;            // tiles of slots in the ring (static, 768 bytes)
  static constexpr int kHeadSteps = kHeads / 16;  // k16 steps over heads (the key gradient's K)
  static constexpr int kKeySteps = kKeys / 16;    // k16 steps over keys (the query gradient's K)
  static constexpr int kDimBlocks = kDim / 64;    // m64 blocks of the query gradient (d in M)
  // fp32 key-gradient rows staged for the bulk reductions, 64 columns of d_I at a time, padded
  // by 4 floats (8 would spread a half-warp's float2 stores over distinct banks, but three blocks
  // then no longer fit an SM).
  static constexpr int kStageStride = 64 + 4;
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

// The dense warm-up's index-score backward (dense_index_score_backward): blocks of three
// warpgroups, one block an SM by registers (<= 168 a thread, as the one-warpgroup kernels use at
// H_I 64, d_I 128), so an operand landed in shared memory serves three warpgroups instead of one.
// Copies run kStages - 1 steps ahead in a ring (one barrier a step), each step's gradients, gates
// (the scores pass's head bits: no product of q and k is computed again) and head weights staged
// with the operand, so no global load waits inside a step.
//   rows kernel: warpgroup r owns the 64 (row, head) pairs of rows 64 / H_I r .. of the block's
//     (one row at H_I 64) as wgmma's M, and all three walk the key tiles of the block's last
//     row's prefix, each key tile read from L2 once for the block's rows (a row's keys past its
//     own prefix get gradient 0);
//   key kernel: kTiles x kSplits = 3 warpgroups, warpgroup (tile, split) owning 64-key tile
//     `tile` of the block's and the rows first + split, first + split + kSplits, ..; a row's q
//     serves kTiles tiles (kTiles = 3 where there are blocks to fill the SMs), or the rows of a
//     tile are split three ways (kSplits = 3, when a block of rows' prefix has few tiles) and the
//     partial sums added in a fixed order.
struct DenseBackwardTraits {
  static constexpr int kWarpgroups = 3;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kStages = 3;
  static constexpr int kPairsPerWarpgroup = 64;  // (row, head) pairs: the rows kernel's M

  // The rows kernel's rows a warpgroup (64 / H_I: H_I divides 64) and a block.
  template <class Tr>
  static constexpr int kRowsPerWarpgroup = kPairsPerWarpgroup / Tr::kHeads;
  template <class Tr>
  static constexpr int kRowsPerBlock = kWarpgroups* kRowsPerWarpgroup<Tr>;

  // Rows kernel shared memory: 1 KB alignment slack, the key tiles' ring, and the rows'
  // gradients (fp32) and gates (64-bit) [stage][row][key], each slot a box of the TMA unit.
  template <class Tr>
  static constexpr int rows_smem_bytes() {
    return 1024 + kStages * Tr::kKeyTileBytes + kStages * kRowsPerBlock<Tr> * Tr::kKeys * (4 + 8);
  }
};

// The key kernel's ring, a slot a step: the query tiles [split], then (each a box of the TMA unit,
// 128-byte aligned) the gradients [split][block keys] fp32, the head weights [split][H_I] fp32
// and the gates [split][block keys]; the splits' partial sums reuse it from the start once the
// rows are done.
template <class Tr, int kTiles, int kSplits>
struct DenseKeyGradLayout {
  using D = DenseBackwardTraits;
  static_assert(kTiles * kSplits == D::kWarpgroups, "a warpgroup a (tile, split)");
  static constexpr int kBlockKeys = kTiles * Tr::kKeys;
  static constexpr int kGradSlotFloats = kSplits * kBlockKeys;  // 256 bytes a 64 keys
  static constexpr int kWeightSlotFloats = (kSplits * Tr::kHeads + 31) / 32 * 32;
  // What the TMA unit lands in a slot besides the queries.
  static constexpr int kTableBytesPerStep = kSplits * (kBlockKeys * (4 + 8) + Tr::kHeads * 4);
  static constexpr int kMainBytes = D::kStages * kSplits * Tr::kQueryBytes +
                                    D::kStages * (kGradSlotFloats + kWeightSlotFloats) * 4 +
                                    D::kStages * kSplits * kBlockKeys * 8;
  static constexpr int kPartialBytes = (kSplits - 1) * kTiles * Tr::kKeys * Tr::kDim * 4;
  static constexpr int kSmemBytes =
      1024 + (kMainBytes > kPartialBytes ? kMainBytes : kPartialBytes);
};

// The dense warm-up's target on tensor cores (dense_target.cu). A block takes 128 (row, head)
// pairs (128 / H rows) against a chunk of kKeyChunk keys, its Q [pairs x d_qk] resident in shared
// memory; the producer warpgroup streams the chunk's 64-key tiles a 64-column block at a time
// through a ring of kSlots slots, and consumer warpgroup w takes tiles w, w + 2, ... against all
// 128 pairs (m64n128k16: 6 KB of operands a k16 step for 262 KFLOP, where two consumers of n64
// halves of the pairs read 8 KB for the same work). S^T [keys x pairs] = K_tile Q^T puts keys in
// M, so the sum over a row's heads is a sum over the accumulator's columns: in registers, then
// across a quad.
struct DenseTargetTraits {
  static constexpr int kThreads = 384;          // consumer warpgroups 0 and 1, producer 2
  static constexpr int kConsumerThreads = 256;  // the turn barriers between the consumers
  static constexpr int kPairs = 128;            // (row, head) pairs of a block (wgmma's N)
  static constexpr int kMaxRows = kPairs / 8;   // rows of a block, at H = 8
  static constexpr int kKeys = 64;              // keys of a tile (wgmma's M)
  static constexpr int kKeyChunk = 2048;        // keys of a block: 32 tiles, 16 a consumer
  // The lse pass's blocks take more keys: each ends by merging its sums across its threads and
  // writing a partial, which fewer blocks a pair pay less often.
  static constexpr int kLseKeyChunk = 8192;
  // The keys of a block of the lse pass (kLse) or the target pass: what its kernel walks and its
  // launcher's grid counts.
  __host__ __device__ static constexpr int key_chunk(bool lse) {
    return lse ? kLseKeyChunk : kKeyChunk;
  }
  static constexpr int kMaxDimQk = 576;              // Q of 128 pairs: 144 KB
  static constexpr int kSlotBytes = kKeys * 64 * 2;  // a tile's 64-column block (swizzled)
  static constexpr int kSlots = 10;  // over one tile at d_qk = 576: the next consumer's comes in
  // Blocks whose products a consumer keeps queued behind the running one. Issuing block n waits
  // for block n - kSlots's slot, freed once block n - kSlots + kQueuedBlocks is issued: so
  // kQueuedBlocks < kSlots, and 7 at most (4-bit slots in a 32-bit queue).
  static constexpr int kQueuedBlocks = 2;
  static_assert(kQueuedBlocks >= 1 && kQueuedBlocks < kSlots && kQueuedBlocks <= 7);
  static constexpr int kBarrierBytes = 1024;  // q_ready, full[kSlots], empty[kSlots], seen
  // The lse pass's registers a thread (setmaxnreg): its consumers keep two running sums a column.
  static constexpr int kConsumerRegisters = 216;
  static constexpr int kProducerRegisters = 72;
  static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536);
  // Shared memory: 1 KB alignment slack, Q, the ring, the barriers.
  static constexpr int smem_bytes(int dim_qk) {
    return 1024 + kPairs * dim_qk * 2 + kSlots * kSlotBytes + kBarrierBytes;
  }
  static_assert(1024 + kPairs * kMaxDimQk * 2 + kSlots * kSlotBytes + kBarrierBytes <= 227 * 1024,
                "the widest Q and the ring fit an SM");
};

// The dense warm-up's visibility over a block of rows: row t (position first_position + t) sees
// keys s < visible(t), its causal prefix (kernels/shapes.h KeyVisibility).
struct PrefixKeys {
  int64_t first_position;  // row 0's position
  int64_t tokens_per_key;
  int64_t num_keys;  // the block's keys
  __device__ int64_t visible(int64_t t) const {
    const int64_t seen = (first_position + t + 1) / tokens_per_key;
    return seen < num_keys ? seen : num_keys;
  }
  // Whether row t sees key s (s < visible(t)), without a division.
  __device__ bool sees(int64_t t, int64_t s) const {
    return s < num_keys && (s + 1) * tokens_per_key <= first_position + t + 1;
  }
  // The first row that sees key s (every later row sees it too).
  __device__ int64_t first_row_seeing(int64_t s) const {
    const int64_t t = (s + 1) * tokens_per_key - 1 - first_position;
    return t > 0 ? t : 0;
  }
};

// indexer_kl: one warp per row.
struct RowWarpTraits {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / 32;
};

// dense_indexer_kl_rows: one block per row (a block of rows is a few hundred rows of up to the
// whole sequence: a warp a row would leave HBM idle).
struct DenseKlTraits {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
};

}  // namespace hyscale::cuda
