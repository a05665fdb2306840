// Tiling of the CUDA sparse MQA attention (sparse_attn.cu), in one place.
//
// A block owns a tile of kRows = 64 rows: G adjacent queries x HB heads of each (HB = min(H,
// 64/G)), and walks the key list of its query group (the selected keys of its query for G = 1, the
// union of the G queries' keys otherwise) in tiles of kKeys keys gathered into shared memory.
// Products run on tensor cores as mma.sync m16n8k16 (bf16 in, fp32 accumulate), operands read from
// XOR-swizzled shared memory with ldmatrix. docs/sparse_attn.md explains the schedule.
#pragma once

namespace hyscale::cuda {

template <int kDimQk_, int kDimV_>
struct SparseAttnTraits {
  static constexpr int kDimQk = kDimQk_;
  static constexpr int kDimV = kDimV_;
  static constexpr int kRows = 64;      // rows (query, head) of a block
  static constexpr int kThreads = 256;  // 8 warps: 4 row groups of 16 x 2 column halves
  static constexpr int kFwdKeys = 64;   // keys per forward tile (each column-half warp: 32 keys)
  static constexpr int kBwdKeys = 32;   // keys per backward tile (each column-half warp: 16 keys)
  // Shared memory, in bf16 elements (Q, K tile, V tile, P tile; the backward adds dO and dS).
  static constexpr int kFwdSmemElems =
      kRows * kDimQk + kFwdKeys * kDimQk + kFwdKeys * kDimV + kRows * kFwdKeys;
  static constexpr int kBwdSmemElems =
      kRows * kDimQk + kRows * kDimV + kBwdKeys * kDimQk + kBwdKeys * kDimV + 2 * kRows * kBwdKeys;
  static_assert(kDimQk % 64 == 0 && kDimV % 64 == 0, "d_qk and d_v must be multiples of 64");
};

// The wgmma kernels (sm_90a), for tiles of one query's 64 heads (G = 1, H a multiple of 64), two
// warpgroups a block. Forward: per 64-key tile, warpgroup w computes S for keys 32w .. 32w + 31
// against all 64 rows, the row maxima meet in shared memory, P (bf16) goes to shared memory, and
// warpgroup w adds P V into its half of the value columns. Tiles lie in wgmma's
// 128-byte-swizzled layout (wgmma.cuh); V is read MN-major straight from its [keys x d_v] tile.
template <int kDimQk_, int kDimV_>
struct SparseAttnWgmmaTraits {
  static constexpr int kDimQk = kDimQk_;
  static constexpr int kDimV = kDimV_;
  static constexpr int kRows = 64;
  static constexpr int kKeys = 64;
  static constexpr int kThreads = 256;
  static constexpr int kKeysPerWarpgroup = kKeys / 2;
  static constexpr int kColumnsPerWarpgroup = kDimV / 2;
  static constexpr int kPvN = kColumnsPerWarpgroup < 128 ? kColumnsPerWarpgroup : 128;  // wgmma N
  static constexpr int kPvChunks = kColumnsPerWarpgroup / kPvN;
  static constexpr bool kSupported = kDimQk % 64 == 0 && kDimV % 128 == 0;
  // Shared memory in bytes: Q, K, V, P tiles (each a multiple of 1 KB), then two [2][64] floats.
  static constexpr int kQBytes = kRows * kDimQk * 2;
  static constexpr int kKBytes = kKeys * kDimQk * 2;
  static constexpr int kVBytes = kKeys * kDimV * 2;
  static constexpr int kPBytes = kRows * kKeys * 2;
  // The backward kernels: 32-key tiles; warpgroup 0 computes S, warpgroup 1 dP, and P crosses
  // in shared memory (fp32, one float per accumulator register). The dq kernel then adds dS K
  // with the d_qk columns' 64-wide blocks split between the warpgroups (the first takes the odd
  // one), in n128 pairs of blocks and one n64 single.
  static constexpr int kBwdKeys = 32;
  static constexpr int kDqBlocks = kDimQk / 64;
  static constexpr int kDqFirstBlocks = (kDqBlocks + 1) / 2;  // warpgroup 0; the rest to 1
  static constexpr int kDqPairs = kDqFirstBlocks / 2;         // n128 accumulators at most
  static constexpr bool kDqSingle = kDqFirstBlocks % 2 == 1 || (kDqBlocks / 2) % 2 == 1;
  // Q, dO, the K and V tiles, the P exchange, a 4 KB zero tile (the operand of the products a
  // warpgroup issues only to keep both warpgroups on one instruction stream), then 8 KB of the
  // kernel's own P / dS tiles.
  static constexpr int kBwdSmemBytes = kRows * (kDimQk + kDimV) * 2 +
                                       kBwdKeys * (kDimQk + kDimV) * 2 + kBwdKeys / 2 * 128 * 4 +
                                       4096 + kRows * 64 * 2;
  // With values inside the keys (absorbed MLA) the V buffer holds the next K tile instead.
  static constexpr int smem_bytes(bool value_in_key) {
    return kQBytes + kKBytes + (value_in_key ? kKBytes : kVBytes) + kPBytes + 2 * 2 * kRows * 4;
  }
};

inline constexpr int kMaxGroup = 16;
// Building a group's key union sorts its G * topk slots in shared memory (one block per group).
inline constexpr int kMaxGroupSlots = 32768;

}  // namespace hyscale::cuda
