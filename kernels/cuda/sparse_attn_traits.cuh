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
  static constexpr int kFwdSmemBytes = kQBytes + kKBytes + kVBytes + kPBytes + 2 * 2 * kRows * 4;
};

// The forward with values inside the keys (absorbed MLA: value = key[:, :d_v]), warp-specialized
// (sm_90a): a block is one query's 64 heads, three warpgroups. The producer gathers 64-key blocks
// into two K buffers (block b into buffer b % 2) with cp.async, each buffer in two halves with
// their own ready and free mbarriers: the left half (the column blocks of warpgroup 0's value
// columns) and the right half (the rest, up to d_qk). Consumer warpgroup c computes S and the
// softmax of the blocks in buffer c, then P V into its half of the value columns (c = 0 the left)
// for both buffers: its own P from registers, the other warpgroup's from shared memory.
template <int kDimQk_, int kDimV_>
struct SparseAttnLatentTraits {
  static constexpr int kDimQk = kDimQk_;
  static constexpr int kDimV = kDimV_;
  static constexpr int kRows = 64;
  static constexpr int kKeys = 64;
  static constexpr int kThreads = 384;          // consumer warpgroups 0, 1; producer 2
  static constexpr int kConsumerThreads = 256;  // named barriers between the consumers
  static constexpr int kColumnsPerWarpgroup = kDimV / 2;
  static constexpr int kPvN = kColumnsPerWarpgroup < 128 ? kColumnsPerWarpgroup : 128;  // wgmma N
  static constexpr int kPvChunks = kColumnsPerWarpgroup / kPvN;
  static constexpr int kColumnBlocks = kDimQk / 64;  // of a K tile
  static constexpr int kLeftBlocks = kColumnsPerWarpgroup / 64;
  // Registers a thread after reallocation (2 x 128 x 216 + 128 x 72 <= 64K): the fewest with
  // which neither role spills at 576 / 512.
  static constexpr int kConsumerRegisters = 216;
  static constexpr int kProducerRegisters = 72;
  static constexpr int kQBytes = kRows * kDimQk * 2;
  static constexpr int kKBytes = kKeys * kDimQk * 2;
  static constexpr int kPBytes = kRows * kKeys * 2;
  // Buffer 0's P lives in its last column block when S alone reads that block (d_qk >= d_v + 64):
  // warpgroup 0 writes it after its S, and the producer refills it only after warpgroup 1's P V
  // has read it.
  static constexpr bool kPInKeyTail = kDimQk - kDimV >= 64;
  // Q, K buffers, P tiles, then the mbarriers and the row exchange (under 1 KB).
  static constexpr int kTilesBytes = kQBytes + 2 * kKBytes + (kPInKeyTail ? 1 : 2) * kPBytes;
  static constexpr int kSmemBytes = kTilesBytes + 1024;
  static constexpr bool kSupported =
      kDimQk % 64 == 0 && kDimV % 128 == 0 && kDimV <= kDimQk && kSmemBytes <= 227 * 1024;
  static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536);
};

inline constexpr int kMaxGroup = 16;
// Building a group's key union sorts its G * topk slots in shared memory (one block per group).
inline constexpr int kMaxGroupSlots = 32768;

}  // namespace hyscale::cuda
