// Tiling of the lightning-indexer scoring on tensor cores, in one place.
//
// One warp scores one query against a tile of kKeysPerTile keys: the product
// K_tile [keys x d] * Q^T [d x heads] runs as mma.sync m16n8k16 (bf16 in, fp32 accumulate) with
// keys in M (from shared memory) and heads in N (the query, in registers for the whole key loop),
// so the ReLU and the head-weighted sum are per-thread FMAs over the heads a thread holds plus two
// shuffles across the quad (docs/flash_topk.md).
#pragma once

namespace hyscale::cuda {

template <int kHeads_, int kDim_>
struct IndexTileTraits {
  static constexpr int kHeads = kHeads_;
  static constexpr int kDim = kDim_;
  static constexpr int kKeysPerTile = 64;
  // Shared-memory rows are padded by 16 bytes so that ldmatrix's eight 16-byte row reads of one
  // 8x8 matrix land in different banks.
  static constexpr int kRowStride = kDim + 8;  // bf16 elements
  static constexpr int kKeyTileElems = kKeysPerTile * kRowStride;
  static constexpr int kMTiles = kKeysPerTile / 16;  // m16 tiles of keys
  static constexpr int kNTiles = kHeads / 8;         // n8 tiles of heads
  static constexpr int kKSteps = kDim / 16;          // k16 steps over d_I
  static constexpr int kHeadsPerLane = 2 * kNTiles;  // weights a lane holds
  static_assert(kHeads % 16 == 0 && kDim % 16 == 0, "heads and dim must be multiples of 16");
};

// The selection kernels (flash_topk.cu): warps (= queries) per block and pipeline depth.
struct SelectTraits {
  // Four warps per block, two blocks per SM: the same speed as eight warps in one block (386 vs
  // 390 ms at N = 128K), with a finer grain for the causal tail and independent barriers.
  static constexpr int kQueriesPerBlock = 4;
  static constexpr int kBlocksPerSm = 2;
  static constexpr int kStages = 3;
  static constexpr int kThreads = kQueriesPerBlock * 32;
  // Per-row finishing kernel (radix select + sort).
  static constexpr int kSelectThreads = 256;
};

}  // namespace hyscale::cuda
