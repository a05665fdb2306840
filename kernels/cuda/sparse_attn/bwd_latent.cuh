// Backward with values inside the keys (SparseAttnLatentBwdTraits): dq and the key rows' gradient
// in one kernel, S and dP computed once a tile.
#pragma once

#include <cstdint>

#include "kernels/cuda/cluster.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sparse_attn/bwd_common.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"
#include "kernels/cuda/warp_specialization.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda::attn {

// The block's shared memory: Q, dO, P and dS, the K tile (each in wgmma's layout), the key
// gradient's staging over the K tile's late blocks and past it, and the key indices.
template <class Tr>
struct LatentBwdTiles {
  bf16 *q, *grad_out, *prob, *grad_score, *key;
  float* stage;
  uint64_t* exchange_bars;  // PartialExchange's: a warpgroup's full ones, then its free ones
  // The key (-1: none) of each slot of tiles j, j + 1, j + 2 at [j % 3]: filled two tiles ahead
  // from the index list, so the gather, the masks and the atomics' targets read shared memory
  // rather than wait on global index loads.
  int32_t (*tile_keys)[Tr::kKeys];
  __device__ explicit LatentBwdTiles(unsigned char* base) {
    q = reinterpret_cast<bf16*>(base);
    grad_out = q + Tr::kRows * Tr::kDimQk;
    prob = grad_out + Tr::kRows * Tr::kDimV;
    grad_score = prob + Tr::kRows * Tr::kKeys;
    key = grad_score + Tr::kRows * Tr::kKeys;
    stage = reinterpret_cast<float*>(key + Tr::kEarlyBlocks * Tr::kKeys * 64);
    tile_keys = reinterpret_cast<int32_t(*)[Tr::kKeys]>(
        reinterpret_cast<unsigned char*>(key + Tr::kKeys * Tr::kDimQk) + Tr::kStagePastTile);
    exchange_bars = reinterpret_cast<uint64_t*>(tile_keys + 3);
  }
};

// The query's two 64-head blocks as a cluster (H a multiple of 128): both form every key-gradient
// chunk's partial over their heads, and for each chunk one of them receives the other's partial
// and adds the sum into the key rows, which halves the fp32 reduction bytes. Warpgroup w exchanges
// with warpgroup w of the partner, its chunks in pairs: of pair (2m, 2m + 1) rank 0 sends 2m + 1
// and receives 2m, rank 1 the other way round, each first forming and sending the partial it
// sends, so that the partner's is on its way while the block forms its own of the other chunk.
// An odd last chunk is received by either block, tile by tile in turn. The partials travel as
// bf16 (half the bytes over the SM-to-SM network; the sum is fp32) into kLandingSlots landing
// buffers a warpgroup (over the K tile's late blocks), a tile's messages in turn, so that a
// partial need not wait for the partner to have read the one before it. A buffer is *full* once
// the partner's stores have landed (transactions on the receiver's mbarrier) and *free* for the
// partner's next partial once read (the receiving warps arrive on the sender's mbarrier) or, for
// a tile's first use, once the K tile's late blocks are no longer read.
template <class Tr>
__device__ void init_partial_exchange(const LatentBwdTiles<Tr>& t) {
  constexpr int S = Tr::kLandingSlots;
  for (int w = 0; w < 2; ++w) {
    for (int s = 0; s < S; ++s) {
      mbarrier_init(t.exchange_bars + 2 * S * w + s, 1);      // full: the receiver's arrival
      mbarrier_init(t.exchange_bars + 2 * S * w + S + s, 4);  // free: the receiving warps
    }
  }
  mbarrier_init_fence();
}

// Warpgroup kWg's exchange of tile j (its addresses are constants); message i of the tile in
// either direction uses landing buffer i % kSlots. The phases of the waits carry over from tile
// to tile.
template <class Tr, int kChunks, int kWg>
class PartialExchange {
 public:
  static constexpr int kSlots = Tr::kLandingSlots;
  static constexpr int kVectors = 4;  // 16-byte vectors of a thread's 32 partials in bf16
  __device__ PartialExchange(const LatentBwdTiles<Tr>& t, int j, uint32_t& phases)
      : landing_(smem_address(t.stage) + kWg * kSlots * Tr::kLandingBytes +
                 (threadIdx.x % 128) * 16),
        bars_(t.exchange_bars + 2 * kSlots * kWg),
        rank_(cluster_rank()),
        receives_last_(kChunks % 2 == 1 && ((j + rank_) & 1) == 0),
        phases_(phases) {}
  __device__ int rank() const { return rank_; }
  // Whether this block receives the odd last chunk.
  __device__ bool receives_last() const { return receives_last_; }
  // K(j)'s late blocks are no longer read: the partner may send tile j's first partials.
  __device__ void offer(int lane) const {
    if (lane != 0) return;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s < receptions()) arrive_remote(partner(smem_address(free_bar(s))));
    }
  }
  // Message i of the tile to the partner.
  __device__ void send(const float (&acc)[32], int i) {
    const int s = i % kSlots;
    mbarrier_wait(free_bar(s), (phases_ >> s) & 1);
    phases_ ^= 1u << s;
    const uint32_t landing = partner(landing_ + s * Tr::kLandingBytes),
                   full = partner(smem_address(full_bar(s)));
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const float* a = acc + 8 * v;
      store_remote(landing + v * 128 * 16,
                   make_uint4(pack_bf16(a[0], a[1]), pack_bf16(a[2], a[3]), pack_bf16(a[4], a[5]),
                              pack_bf16(a[6], a[7])),
                   full);
    }
  }
  // Adds the partner's message i into acc and the sum into the key rows, a vector at a time (the
  // values leave as soon as they are summed, which keeps registers free); then release(i).
  __device__ void receive_into_keys(float (&acc)[32], const int32_t* tile_keys, float* grad_key,
                                    int c, int i, int warp, int lane) {
    constexpr int DQ = Tr::kDimQk;
    const int s = i % kSlots;
    if (threadIdx.x % 128 == 0) mbarrier_arrive_expect(full_bar(s), Tr::kLandingBytes);
    const int key0 = tile_keys[16 * warp + lane / 4], key1 = tile_keys[16 * warp + lane / 4 + 8];
    float* dst0 = grad_key + int64_t(key0 < 0 ? 0 : key0) * DQ + c * 64 + 2 * (lane % 4);
    float* dst1 = grad_key + int64_t(key1 < 0 ? 0 : key1) * DQ + c * 64 + 2 * (lane % 4);
    mbarrier_wait(full_bar(s), (phases_ >> (kSlots + s)) & 1);
    phases_ ^= 1u << (kSlots + s);
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      float* a = acc + 8 * v;
      add_bf16_from_shared(a, landing_ + s * Tr::kLandingBytes + v * 128 * 16);
      if (key0 >= 0) red_add_v2(dst0 + 16 * v, a[0], a[1]);
      if (key1 >= 0) red_add_v2(dst1 + 16 * v, a[2], a[3]);
      if (key0 >= 0) red_add_v2(dst0 + 16 * v + 8, a[4], a[5]);
      if (key1 >= 0) red_add_v2(dst1 + 16 * v + 8, a[6], a[7]);
    }
    release(i, lane);
  }

 private:
  // The tile's messages from the partner.
  __device__ int receptions() const {
    return kChunks / 2 + (receives_last_ ? 1 : 0);
  }
  // The partner may send into buffer i % kSlots again, unless message i was that buffer's last of
  // the tile (it then belongs to the next K tile until offer()). Each warp arrives once all its
  // threads have added what they loaded.
  __device__ void release(int i, int lane) const {
    if (i + kSlots >= receptions()) return;
    __syncwarp();
    if (lane == 0) arrive_remote(partner(smem_address(free_bar(i % kSlots))));
  }
  __device__ uint32_t partner(uint32_t local) const {
    return cluster_address(local, rank_ ^ 1);
  }
  __device__ uint64_t* full_bar(int s) const {
    return bars_ + s;
  }
  __device__ uint64_t* free_bar(int s) const {
    return bars_ + kSlots + s;
  }
  const uint32_t landing_;  // this thread's first vector of the warpgroup's first landing buffer
  uint64_t* const bars_;    // the warpgroup's full mbarriers, then its free ones
  const int rank_;
  const bool receives_last_;
  uint32_t& phases_;  // parities of the next waits: bits 0.. free (sending), kSlots.. full
};

// Key-gradient chunk c (columns 64c ..) of the tile's 64 keys: dS^T Q[:, c] (+ P^T dO[:, c] when
// value_part, a constant wherever this is unrolled), keys as M (dS^T and P^T read MN-major), into
// acc. The descriptors of a chunk chosen at run time (a paired block's) are made here, not
// hoisted out of the tile loop.
template <class Tr>
__device__ void key_grad_chunk(float (&acc)[32], const LatentBwdTiles<Tr>& t, int c,
                               bool value_part) {
  wgmma_fence();
  const uint64_t q = descriptor_here(mn_major_descriptor<64>(t.q, c * 64, 0));
#pragma unroll
  for (int ks = 0; ks < Tr::kRows / 16; ++ks) {
    Wgmma<64, 1, bf16, 1>::run(acc, mn_major_descriptor<64>(t.grad_score, 0, ks * 16),
                               advance_mn_major<64>(q, 0, ks * 16), ks > 0);
  }
  if (value_part) {
    const uint64_t grad_out = descriptor_here(mn_major_descriptor<64>(t.grad_out, c * 64, 0));
#pragma unroll
    for (int ks = 0; ks < Tr::kRows / 16; ++ks) {
      Wgmma<64, 1, bf16, 1>::run(acc, mn_major_descriptor<64>(t.prob, 0, ks * 16),
                                 advance_mn_major<64>(grad_out, 0, ks * 16), 1);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(acc);
}

// Adds a thread's rows of key-gradient chunk c (its accumulators, keys as M) into the key rows:
// pairs of adjacent columns by red instructions.
template <int DQ>
__device__ void add_chunk_into_keys(const float (&acc)[32], const int32_t* tile_keys,
                                    float* grad_key, int c, int warp, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = tile_keys[16 * warp + lane / 4 + 8 * half];
    if (key < 0) continue;
    float* dst = grad_key + int64_t(key) * DQ + c * 64 + 2 * (lane % 4);
#pragma unroll
    for (int n8 = 0; n8 < 8; ++n8) {
      red_add_v2(dst + 8 * n8, acc[4 * n8 + 2 * half], acc[4 * n8 + 2 * half + 1]);
    }
  }
}

// A query's key slots with its tiles rotated: slot s reads the list's tile (s / kKeys + first)
// mod tiles. In position-ordered selections (FlashTopK's) a tile's keys lie in one stretch of the
// sequence; rotating each query by its launch position makes the queries resident at a time work
// in the same stretch, so that more of their key rows and gradient rows are found in L2.
template <int kKeys>
struct RotatedKeys {
  KeyList list;
  int first_slot;
  __device__ RotatedKeys(const KeyList& keys, int grp, int resident_queries) : list(keys) {
    first_slot =
        resident_queries > 0 ? rotated_first_tile(grp, resident_queries, tiles()) * kKeys : 0;
  }
  __device__ int tiles() const { return static_cast<int>(ceil_div(list.count, kKeys)); }
  // The list's slot that rotated slot `rotated` (< tiles() * kKeys) reads.
  __device__ int slot(int rotated) const {
    const int span = tiles() * kKeys, at = rotated + first_slot;
    return at >= span ? at - span : at;
  }
  __device__ int key(int rotated) const {
    return rotated >= tiles() * kKeys ? -1 : list.key(slot(rotated));
  }
};

// Tile j's S and dP for warpgroup wg's half of the keys, then its P and dS into their tiles: the
// k-steps over K(j)'s early blocks (landed and visible), then, once late_blocks_landed() has
// made the late ones visible, the rest. Both products read their A operand (Q, dO) whole, so the
// halves together read it twice; in exchange P stays fp32 for dS and no warpgroup waits for the
// other here. With kMass, P's sums over the block's heads at the warpgroup's slots are added into
// mass_row (the query's row of BwdArgs::mass; its other head blocks add theirs), in fp32 from the
// registers P is formed in.
template <class Tr, bool kMass, class LateBlocksLanded>
__device__ void latent_bwd_scores(const Problem& p, int j, const LatentBwdTiles<Tr>& t,
                                  const BwdRows& r, int wg, int lane,
                                  const RotatedKeys<Tr::kKeys>& list, float* mass_row,
                                  LateBlocksLanded late_blocks_landed) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kKeys, kHalf = BK / 2;
  constexpr int kEarlySteps = Tr::kEarlyBlocks * 4;
  float s[kHalf / 2], dp[kHalf / 2];
  const uint64_t key0 = descriptor_here(matrix_descriptor<BK>(t.key, wg * kHalf, 0));
  const uint64_t q0 = descriptor_here(matrix_descriptor<64>(t.q, 0, 0));
  const uint64_t do0 = descriptor_here(matrix_descriptor<64>(t.grad_out, 0, 0));
  auto steps = [&](int first, int end) {
#pragma unroll
    for (int ks = first; ks < end && ks < DQ / 16; ++ks) {
      Wgmma<kHalf>::run(s, advance_descriptor<64>(q0, ks), advance_descriptor<BK>(key0, ks),
                        ks > 0);
    }
#pragma unroll
    for (int ks = first; ks < end && ks < DV / 16; ++ks) {
      Wgmma<kHalf>::run(dp, advance_descriptor<64>(do0, ks), advance_descriptor<BK>(key0, ks),
                        ks > 0);
    }
  };
  wgmma_fence();
  steps(0, kEarlySteps);
  wgmma_commit();
  late_blocks_landed();
  steps(kEarlySteps, DQ / 16);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  float mass[kHalf / 8][2] = {};  // this thread's columns, over its two rows
#pragma unroll
  for (int i = 0; i < kHalf / 2; i += 2) {
    const int col = wg * kHalf + 8 * (i / 4) + 2 * (lane % 4);
    const bool lower = i % 4 < 2;
    const float lse = lower ? r.lse_a : r.lse_b, delta = lower ? r.d_a : r.d_b;
    float prob[2], ds[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool seen = t.tile_keys[j % 3][col + e] >= 0;
      prob[e] = seen ? exp2f(s[i + e] * p.scale_log2 - lse) : 0.f;
      ds[e] = prob[e] * (dp[i + e] - delta) * p.scale;
      if constexpr (kMass) mass[i / 4][e] += prob[e];
    }
    const int at = swizzled_offset<64>(lower ? r.ra : r.rb, col / 8) + col % 8;
    *reinterpret_cast<uint32_t*>(t.prob + at) = pack_bf16(prob[0], prob[1]);
    *reinterpret_cast<uint32_t*>(t.grad_score + at) = pack_bf16(ds[0], ds[1]);
  }
  if constexpr (kMass) {
    // The warp's 16 rows, reduced and scattered across the 8 lanes of a quad position: each
    // exchange halves the columns a lane holds, so 7 shuffles leave every lane one column's sum
    // (the column v = lane / 4 of its eight), and the warp adds its 32 sums in one instruction.
    static_assert(kHalf / 8 * 2 == 8, "eight columns a thread, one a lane after the exchanges");
    float x[8];
#pragma unroll
    for (int v = 0; v < 8; ++v) x[v] = mass[v / 2][v % 2];
#pragma unroll
    for (int width = 4, bit = 16; width >= 1; width /= 2, bit /= 2) {
      const bool upper = (lane & bit) != 0;  // keeps the upper half of its columns
#pragma unroll
      for (int v = 0; v < width; ++v) {
        const float send = upper ? x[v] : x[v + width];
        x[v] = (upper ? x[v + width] : x[v]) + __shfl_xor_sync(0xffffffffu, send, bit);
      }
    }
    const int v = lane / 4;
    const int col = wg * kHalf + 8 * (v / 2) + 2 * (lane % 4) + v % 2;
    if (t.tile_keys[j % 3][col] >= 0) atomicAdd(mass_row + list.slot(j * Tr::kKeys + col), x[0]);
  }
}

// Warpgroup kWg's products of tile j once P and dS are visible: dq (+)= dS K over its column
// blocks; then, K(j) free in both warpgroups, the gather of K(j + 1) starts; then its chunks of
// the key gradient, each added into the key rows (kPaired: by this block or its partner).
template <class Tr, int kWg, bool kPaired>
__device__ void latent_bwd_grads(const Problem& p, const BwdArgs& g,
                                 const RotatedKeys<Tr::kKeys>& list, int j,
                                 const LatentBwdTiles<Tr>& t,
                                 float (&dq_pair)[Tr::kDqPairArrays][64], float (&dq_single)[32],
                                 float (&dq_half)[16], uint32_t& exchange_phases, int tid, int warp,
                                 int lane) {
  constexpr int DQ = Tr::kDimQk, BK = Tr::kKeys, T = Tr::kThreads;
  constexpr int kFirstBlock = kWg * Tr::kDqBlocksEach, kHalfCol = (Tr::kBlocks - 1) * 64 + 32 * kWg;
  constexpr int kFirstChunk = kWg == 0 ? 0 : Tr::kDkvFirstChunks;
  constexpr int kEndChunk = kWg == 0 ? Tr::kDkvFirstChunks : Tr::kBlocks;
  constexpr int kChunks = kEndChunk - kFirstChunk;
  PartialExchange<Tr, kChunks, kWg> exchange(t, j, exchange_phases);
  // Tile j + 2's keys, a slot a thread of warpgroup 0: loaded now, stored once dq has retired.
  static_assert(BK <= 128, "warpgroup 0 holds a tile's slots");
  const bool loads_ahead = kWg == 0 && tid < BK;
  const int ahead = loads_ahead ? list.key((j + 2) * BK + tid) : -1;
  auto fence_dq = [&] {
#pragma unroll
    for (int c = 0; c < Tr::kDqPairs; ++c) fence_accumulators(dq_pair[c]);
    if constexpr (Tr::kDqSingle) fence_accumulators(dq_single);
    if constexpr (Tr::kDqHalf) fence_accumulators(dq_half);
  };
  fence_dq();
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < BK / 16; ++ks) {
    const uint64_t a = matrix_descriptor<64>(t.grad_score, 0, ks);
#pragma unroll
    for (int c = 0; c < Tr::kDqPairs; ++c) {
      Wgmma<128, 1>::run(dq_pair[c], a,
                         mn_major_descriptor<BK>(t.key, (kFirstBlock + 2 * c) * 64, ks * 16), 1);
    }
    if constexpr (Tr::kDqSingle) {
      Wgmma<64, 1>::run(
          dq_single, a,
          mn_major_descriptor<BK>(t.key, (kFirstBlock + Tr::kDqBlocksEach - 1) * 64, ks * 16), 1);
    }
    if constexpr (Tr::kDqHalf) {
      Wgmma<32, 1>::run(dq_half, a, mn_major_descriptor<BK>(t.key, kHalfCol, ks * 16), 1);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_dq();
  if (loads_ahead) {
    // (Read at tiles j + 1 and j + 2, past barriers; the slot's last reader, tile j - 1's
    // atomics, finished before this tile's first barrier.) Its rows are not prefetched into L2:
    // the backward was 2-3 % faster without (docs/performance.md, section 7).
    t.tile_keys[(j + 2) % 3][tid] = ahead;
  }
  named_barrier_sync(1, T);  // K(j) is no longer read
  if constexpr (kPaired) exchange.offer(lane);
  if (j + 1 < list.tiles()) {
    gather_row_wgmma<DQ, BK, T>(t.key, p.key, t.tile_keys[(j + 1) % 3][tid / (T / BK)], tid, 0,
                                Tr::kEarlyBlocks);
  }
  cp_async_commit();

  // The key gradient, a 64-column chunk at a time. Paired, each chunk's receiver adds the sum by
  // red instructions (PartialExchange); alone, every other chunk leaves by red instructions, the
  // rest through each warp's staging of its 16 rows, a bulk reduction a row (the traits say why).
  const int32_t* const keys = t.tile_keys[j % 3];
  if constexpr (kPaired) {
#pragma unroll
    for (int m = 0; m < kChunks / 2; ++m) {
      const int pair = kFirstChunk + 2 * m, rank = exchange.rank();
      const bool value_part = pair < Tr::kValueBlocks;  // the traits keep pairs alike
      {
        float acc[32];
        key_grad_chunk(acc, t, pair + 1 - rank, value_part);
        exchange.send(acc, m);
      }
      float acc[32];
      key_grad_chunk(acc, t, pair + rank, value_part);
      exchange.receive_into_keys(acc, keys, g.grad_key, pair + rank, m, warp, lane);
    }
    if constexpr (kChunks % 2 == 1) {
      constexpr int c = kEndChunk - 1;
      float acc[32];
      key_grad_chunk(acc, t, c, c < Tr::kValueBlocks);
      if (exchange.receives_last()) {
        exchange.receive_into_keys(acc, keys, g.grad_key, c, kChunks / 2, warp, lane);
      } else {
        exchange.send(acc, kChunks / 2);
      }
    }
    return;
  }
  float* const stage = t.stage + (tid / 32) * 16 * Tr::kStageRowFloats;
  const int staged_key = lane < 16 ? keys[16 * warp + lane] : -1;
  const uint64_t policy = l2_evict_last_policy();
#pragma unroll
  for (int c = kFirstChunk; c < kEndChunk; ++c) {
    float acc[32];
    key_grad_chunk(acc, t, c, c < Tr::kValueBlocks);
    if ((c - kFirstChunk) % 2 == 1) {  // red instructions
      add_chunk_into_keys<DQ>(acc, keys, g.grad_key, c, warp, lane);
    } else {                // bulk reductions
      bulk_wait_read<0>();  // the previous bulk chunk's reductions have read the staging
      __syncwarp();
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float* row = stage + (lane / 4 + 8 * half) * Tr::kStageRowFloats + 2 * (lane % 4);
#pragma unroll
        for (int n8 = 0; n8 < 8; ++n8) {
          *reinterpret_cast<float2*>(row + 8 * n8) =
              make_float2(acc[4 * n8 + 2 * half], acc[4 * n8 + 2 * half + 1]);
        }
      }
      fence_async_shared();
      __syncwarp();
      if (staged_key >= 0) {
        bulk_reduce_add(g.grad_key + int64_t(staged_key) * DQ + c * 64,
                        stage + lane * Tr::kStageRowFloats, 64 * 4, policy);
      }
      bulk_commit();
    }
  }
}

template <class Tr, bool kPaired, bool kMass>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_bwd_latent_kernel(Problem p, BwdArgs g) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kKeys, T = Tr::kThreads;
  extern __shared__ __align__(1024) unsigned char latent_bwd_raw[];
  const LatentBwdTiles<Tr> t(latent_bwd_raw);
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid % 32;
  const auto [grp, h0] = block_tile(p);
  const RotatedKeys<BK> list(key_list(p, grp), grp, g.resident_queries);
  float* const mass_row = kMass ? g.mass + int64_t(grp) * p.topk : nullptr;
  load_block_rows<DQ, T>(t.q, p.q, p, grp, h0, tid);
  load_block_rows<DV, T>(t.grad_out, g.grad_out, p, grp, h0, tid);
  // K's early blocks and its late blocks are separate copy groups, as in every later tile.
  const int first_key = list.key(tid / (T / BK));
  gather_row_wgmma<DQ, BK, T>(t.key, p.key, first_key, tid, 0, Tr::kEarlyBlocks);
  cp_async_commit();
  gather_row_wgmma<DQ, BK, T>(t.key, p.key, first_key, tid, Tr::kEarlyBlocks, Tr::kBlocks);
  cp_async_commit();
  if (tid < 2 * BK) t.tile_keys[tid / BK][tid % BK] = list.key(tid);  // tiles 0 and 1's keys
  const BwdRows r = bwd_rows(p, g, grp, h0, warp * 16 + lane / 4);
  uint32_t exchange_phases = 0;
  if constexpr (kPaired) {
    if (tid == 0) init_partial_exchange(t);
    cluster_sync();  // the partner's mbarriers are initialized before any arrival on them
  }

  float dq_pair[Tr::kDqPairArrays][64], dq_single[32], dq_half[16];
  clear_accumulators(dq_pair);
#pragma unroll
  for (int i = 0; i < 32; ++i) dq_single[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) dq_half[i] = 0.f;
  for (int j = 0; j < list.tiles(); ++j) {
    cp_async_wait<1>();  // K(j)'s early blocks (and, first, Q and dO) have landed
    fence_async_shared();
    __syncthreads();  // and the previous tile's P and dS are no longer read
    latent_bwd_scores<Tr, kMass>(p, j, t, r, wg, lane, list, mass_row, [&] {
      cp_async_wait<0>();  // and its late blocks
      fence_async_shared();
      __syncthreads();
    });
    fence_async_shared();  // P and dS are read by wgmma
    __syncthreads();
    if (wg == 0) {
      latent_bwd_grads<Tr, 0, kPaired>(p, g, list, j, t, dq_pair, dq_single, dq_half,
                                       exchange_phases, tid, warp, lane);
    } else {
      latent_bwd_grads<Tr, 1, kPaired>(p, g, list, j, t, dq_pair, dq_single, dq_half,
                                       exchange_phases, tid, warp, lane);
    }
    // Every warp's reductions (or receptions) have read the staging: K(j + 1)'s late blocks can
    // come in.
    bulk_wait_read<0>();
    __syncthreads();
    if (j + 1 < list.tiles()) {
      gather_row_wgmma<DQ, BK, T>(t.key, p.key, t.tile_keys[(j + 1) % 3][tid / (T / BK)], tid,
                                  Tr::kEarlyBlocks, Tr::kBlocks);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();
  bulk_wait_all();

  store_dq<DQ>(g, r, lane, dq_pair, dq_single, wg * Tr::kDqBlocksEach, Tr::kDqBlocksEach);
  if constexpr (Tr::kDqHalf) {
    store_dq_columns<DQ>(g, r, lane, dq_half, 32, (Tr::kBlocks - 1) * 64 + 32 * wg);
  }
  if constexpr (kPaired) cluster_sync();  // the partner no longer arrives on this block's mbarriers
}

}  // namespace hyscale::cuda::attn
