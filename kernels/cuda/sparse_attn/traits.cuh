// Tiling of the CUDA sparse MQA attention (kernels/cuda/sparse_attn/), in one place.
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

// The block tile of the wgmma kernel families: one query's 64 heads (rows) against 64-key tiles.
template <int kDimQk_, int kDimV_>
struct WholeHeadTile {
  static constexpr int kDimQk = kDimQk_;
  static constexpr int kDimV = kDimV_;
  static constexpr int kRows = 64;
  static constexpr int kKeys = 64;
};

// The wgmma kernels (sm_90a), for tiles of one query's 64 heads (G = 1, H a multiple of 64), two
// warpgroups a block. Forward: per 64-key tile, warpgroup w computes S for keys 32w .. 32w + 31
// against all 64 rows, the row maxima meet in shared memory, P (bf16) goes to shared memory, and
// warpgroup w adds P V into its half of the value columns. Tiles lie in wgmma's
// 128-byte-swizzled layout (wgmma.cuh); V is read MN-major straight from its [keys x d_v] tile.
template <int kDimQk_, int kDimV_>
struct SparseAttnWgmmaTraits : WholeHeadTile<kDimQk_, kDimV_> {
  using Tile = WholeHeadTile<kDimQk_, kDimV_>;
  using Tile::kDimQk, Tile::kDimV, Tile::kKeys, Tile::kRows;
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
struct SparseAttnLatentTraits : WholeHeadTile<kDimQk_, kDimV_> {
  using Tile = WholeHeadTile<kDimQk_, kDimV_>;
  using Tile::kDimQk, Tile::kDimV, Tile::kKeys, Tile::kRows;
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

// The backward with values inside the keys (absorbed MLA), one kernel for dq and the key rows'
// whole gradient (sm_90a): a block is one query's 64 heads, two warpgroups, 64-key tiles gathered
// into one K tile. Warpgroup w computes S and dP for keys 32w.. of a tile (m64n32), then P and dS
// (bf16) go to shared memory, where both warpgroups read them: dq (+)= dS K into registers, the
// 64-wide column blocks split evenly between the warpgroups (an odd one by halves), and the key
// gradient dS^T Q + P^T dO (the value part added into the first d_v columns) a 64-column chunk at
// a time (m64n64, keys as M), added into the key rows with fp32 atomics. The next K tile streams
// in while the key gradient is formed: only S, dP and dq read K.
template <int kDimQk_, int kDimV_>
struct SparseAttnLatentBwdTraits : WholeHeadTile<kDimQk_, kDimV_> {
  using Tile = WholeHeadTile<kDimQk_, kDimV_>;
  using Tile::kDimQk, Tile::kDimV, Tile::kKeys, Tile::kRows;
  static constexpr int kThreads = 256;
  static constexpr int kBlocks = kDimQk / 64;      // 64-column blocks of dq and chunks of dkv
  static constexpr int kValueBlocks = kDimV / 64;  // chunks that also take P^T dO
  // dq: warpgroup w takes kDqBlocksEach whole column blocks from w * kDqBlocksEach (n128 pairs,
  // then an n64 block if their count is odd) and, when kBlocks is odd, columns 32w .. 32w + 31 of
  // the last block (n32), so that both hold the same number of accumulators: the kernel is at
  // the register limit, and the warpgroup with more sets it.
  static constexpr int kDqBlocksEach = kBlocks / 2;
  static constexpr int kDqPairs = kDqBlocksEach / 2;
  static constexpr int kDqPairArrays = kDqPairs > 0 ? kDqPairs : 1;  // no zero-length array
  static constexpr bool kDqSingle = kDqBlocksEach % 2 == 1;
  static constexpr bool kDqHalf = kBlocks % 2 == 1;
  // Warpgroup 0 takes the first key-gradient chunks, as many as balance the k16 steps of both
  // warpgroups' dq and dkv products (4 a dq block, 2 a half, 4 or 8 a chunk).
  static constexpr int dkv_first_chunks() {
    int best = 0, best_gap = 1 << 30;
    for (int split = 0; split <= kBlocks; ++split) {
      int work[2] = {4 * kDqBlocksEach + 2 * kDqHalf, 4 * kDqBlocksEach + 2 * kDqHalf};
      for (int c = 0; c < kBlocks; ++c) work[c < split ? 0 : 1] += c < kValueBlocks ? 8 : 4;
      const int gap = work[0] > work[1] ? work[0] - work[1] : work[1] - work[0];
      if (gap < best_gap) best = split, best_gap = gap;
    }
    return best;
  }
  static constexpr int kDkvFirstChunks = dkv_first_chunks();
  // The key gradient leaves by two paths at once, which together carried more than either
  // (docs/performance.md, section 7): every other chunk of a warpgroup as red instructions from
  // registers, the rest through shared memory, where each warp stages its 16 key rows of a chunk
  // (64 fp32 each, rows 272 bytes apart so that a warp's stores do not conflict) for bulk
  // reductions (one 256-byte row piece each). The staging lies over the K tile's last column blocks
  // (the late blocks: the next tile's gather fills them once the key gradient has left) and the
  // bytes after the tile.
  static constexpr int kStageRowFloats = 64 + 4;
  static constexpr int kStageBytes = kThreads / 32 * 16 * kStageRowFloats * 4;
  static constexpr int kLateBlocks = kBlocks < 4 ? kBlocks : 4;
  static constexpr int kEarlyBlocks = kBlocks - kLateBlocks;
  static constexpr int kLateBytes = kLateBlocks * kKeys * 128;
  static constexpr int kStagePastTile = kStageBytes > kLateBytes ? kStageBytes - kLateBytes : 0;
  // With H a multiple of 128 the query's two 64-head blocks run as a cluster and sum their
  // partials of every chunk before one of them adds it into the key rows (PartialExchange): a
  // warpgroup receives its partner's partial (its 128 threads' 32 accumulators, rounded to bf16:
  // the SM-to-SM network carries them at about the rate the L2 adds fp32) into one of
  // kLandingSlots landing buffers over the staging (kLandingBytes each), each with two mbarriers
  // (full, free). A warpgroup forms its chunks in pairs (2m, 2m + 1), and either block may send
  // the first: both chunks of a pair must be alike, with or without the value part (kPairable).
  static constexpr bool pairs_alike() {
    for (int wg = 0; wg < 2; ++wg) {
      const int first = wg == 0 ? 0 : kDkvFirstChunks, end = wg == 0 ? kDkvFirstChunks : kBlocks;
      for (int c = first; c + 1 < end; c += 2) {
        if ((c < kValueBlocks) != (c + 1 < kValueBlocks)) return false;
      }
    }
    return true;
  }
  static constexpr bool kPairable = pairs_alike();
  static constexpr int kLandingSlots = 2;
  static constexpr int kLandingBytes = 128 * 32 * 2;
  static constexpr int kExchangeBarriers = 2 * 2 * kLandingSlots;
  static_assert(2 * kLandingSlots * kLandingBytes <= kStageBytes,
                "both warpgroups' landing buffers lie in the staging");
  // Q, dO, the P and dS tiles ([rows x keys], one 128-byte column block each), the K tile, the
  // staging past it, three tiles' key indices, then the exchange's mbarriers.
  static constexpr int kSmemBytes =
      2 * (kRows * kDimQk + kRows * kDimV + kKeys * kDimQk + 2 * kRows * kKeys) + kStagePastTile +
      3 * kKeys * 4 + kExchangeBarriers * 8;
  // kBlocks >= 3: the shapes the GPU tests cover (d_qk = 128 takes the separate values' kernels).
  static constexpr bool kSupported = kDimQk % 64 == 0 && kDimV % 64 == 0 && kDimV <= kDimQk &&
                                     kBlocks >= 3 && kSmemBytes <= 227 * 1024;
};

inline constexpr int kMaxGroup = 16;
// Building a group's key union sorts its G * topk slots in shared memory (one block per group).
inline constexpr int kMaxGroupSlots = 32768;

}  // namespace hyscale::cuda
