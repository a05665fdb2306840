// Tiling of the lightning-indexer scoring on tensor cores, in one place.
//
// A warpgroup scores one query against a tile of kKeysPerTile keys: the product
// K_tile [keys x d] * Q^T [d x heads] runs as wgmma m64nHk16 (bf16 in; m64nHk32 with fp8 e4m3 in;
// fp32 accumulate) with keys in M and heads in N, both operands in shared memory, so the ReLU and
// the head-weighted sum are per-thread FMAs over the heads a thread holds plus two shuffles across
// the quad (index_score_warpgroup.cuh, docs/flash_topk.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace hyscale::cuda {

template <int kHeads_, int kDim_, class Element_ = __nv_bfloat16>
struct IndexTileTraits {
  using Element = Element_;  // __nv_bfloat16, or __nv_fp8_e4m3 for fp8 scoring
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static constexpr int kHeads = kHeads_;
  static constexpr int kDim = kDim_;
  static constexpr int kKeysPerTile = 64;  // wgmma's M
  // Rows go through the tile helpers of wgmma.cuh, which count 2-byte units: a row of d_I
  // elements is kRowUnits of them, and a tile row takes at least one 128-byte swizzle row (an fp8
  // row of d_I = 64 uses half of it).
  static constexpr int kRowUnits = kDim * static_cast<int>(sizeof(Element)) / 2;
  static constexpr int kTileRowUnits = kRowUnits < 64 ? 64 : kRowUnits;
  static constexpr int kKeyTileElems = kKeysPerTile * kTileRowUnits;  // in 2-byte units
  static constexpr int kQueryElems = kHeads * kTileRowUnits;
  static constexpr int kNTiles = kHeads / 8;  // n8 column groups of heads
  // A k-step covers 32 bytes of d_I: k16 for bf16, k32 for fp8.
  static constexpr int kKSteps = kDim * static_cast<int>(sizeof(Element)) / 32;
  static constexpr int kHeadsPerLane = 2 * kNTiles;  // weights a lane holds
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
  // The per-row threshold and finishing kernels run kRadixSelectThreads (radix_select.cuh).
};

}  // namespace hyscale::cuda
