// Tiling of the lightning-indexer scoring on tensor cores, in one place.
//
// A warpgroup scores one query against a tile of kKeysPerTile keys: the product
// K_tile [keys x d] * Q^T [d x heads] runs as wgmma m64nHk16 (bf16 in, fp32 accumulate) with keys
// in M and heads in N, both operands in shared memory, so the ReLU and the head-weighted sum are
// per-thread FMAs over the heads a thread holds plus two shuffles across the quad
// (index_score_warpgroup.cuh, docs/flash_topk.md).
#pragma once

namespace hyscale::cuda {

template <int kHeads_, int kDim_>
struct IndexTileTraits {
  static constexpr int kHeads = kHeads_;
  static constexpr int kDim = kDim_;
  static constexpr int kKeysPerTile = 64;                    // wgmma's M
  static constexpr int kKeyTileElems = kKeysPerTile * kDim;  // swizzled layout, no padding
  static constexpr int kQueryElems = kHeads * kDim;
  static constexpr int kNTiles = kHeads / 8;         // n8 column groups of heads
  static constexpr int kKSteps = kDim / 16;          // k16 steps over d_I
  static constexpr int kHeadsPerLane = 2 * kNTiles;  // weights a lane holds
  // d_I in whole 64-dim (128-byte) swizzle blocks.
  static_assert(kHeads % 16 == 0 && kHeads <= 64 && kDim % 64 == 0, "unsupported tile shape");
};

// The selection kernels (flash_topk.cu): queries per block, warpgroups, pipeline depth.
struct SelectTraits {
  // One warpgroup a block scores four queries against each key tile, in two wgmma chains of two
  // (N = 2 * H_I = 128 at H_I = 64): the first chain's epilogue overlaps the second's products;
  // two blocks per SM, so one block's epilogue also overlaps the other's products.
  static constexpr int kQueriesPerBlock = 4;
  static constexpr int kBlocksPerSm = 2;
  static constexpr int kStages = 3;
  static constexpr int kThreads = 128;
  // Per-row finishing kernel (radix select + sort).
  static constexpr int kSelectThreads = 256;
};

}  // namespace hyscale::cuda
