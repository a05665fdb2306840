// What every kernel of the CUDA sparse MQA attention shares: the problem a launch solves, the key
// list of a block and the loads of its tiles, and the accumulators' small helpers.
//
// Block tile (traits.cuh): 64 rows = G adjacent queries x HB heads. The block's key list is its
// query's selected slots (G = 1) or the sorted union of its G queries' keys with a G-bit mask per
// entry (G > 1, built by build_union_kernel in key_union.cu); a row sees an entry only when its
// query's bit is set, so every row attends exactly its own selected set.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sparse_attn/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda::attn {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;

// Everything a block needs to know about its rows and its key list.
struct Problem {
  const bf16 *q, *key, *value;
  const int32_t* indices;  // [N, topk] (G = 1)
  const int32_t* ukeys;    // [groups, cap] sorted key union (G > 1)
  const uint16_t* umask;   // [groups, cap] bit g: query g of the group selected the key
  const int32_t* ucount;   // [groups] union sizes (G > 1); G = 1: each query's slots up to its
                           // last valid one (the -1 slots after it are skipped, not masked)
  int64_t cap;
  int n, heads, topk, group, hb;
  float scale, scale_log2;
};

// The key list of block `grp`.
struct KeyList {
  const int32_t* keys;
  const uint16_t* mask;  // null for G = 1
  int count;
  __device__ int key(int slot) const { return slot < count ? keys[slot] : -1; }
  // Whether rows of query g (in the group) attend `slot`.
  __device__ bool sees(int slot, int g) const {
    if (slot >= count) return false;
    return mask ? ((mask[slot] >> g) & 1) != 0 : keys[slot] >= 0;
  }
};

// The block's query group and first head. The head blocks of a query are adjacent in launch
// order, so they run at the same time and the later ones find the gathered key rows in L2.
struct BlockTile {
  int grp, h0;
};
// Tile `item` of the launch order (the block index, or a persistent block's item).
inline __device__ BlockTile tile_of(const Problem& p, int item) {
  const int head_blocks = (p.heads + p.hb - 1) / p.hb;
  return {item / head_blocks, item % head_blocks * p.hb};
}
inline __device__ BlockTile block_tile(const Problem& p) {
  return tile_of(p, static_cast<int>(blockIdx.x));
}

inline __device__ KeyList key_list(const Problem& p, int grp) {
  if (p.group == 1) return {p.indices + int64_t(grp) * p.topk, nullptr, p.ucount[grp]};
  return {p.ukeys + grp * p.cap, p.umask + grp * p.cap, p.ucount[grp]};
}

// Global row (query * H + head) of tile row r, or -1 when the row lies outside the problem.
inline __device__ int64_t tile_row(const Problem& p, int grp, int h0, int r) {
  const int g = r / p.hb, h = h0 + r % p.hb;
  const int64_t query = int64_t(grp) * p.group + g;
  if (g >= p.group || h >= p.heads || query >= p.n) return -1;
  return query * p.heads + h;
}

// Copy the 64 rows of a [rows][D] tile (zeros for rows outside the problem).
template <int D, int kThreads>
__device__ void load_tile_rows(bf16* tile, const bf16* src, const Problem& p, int grp, int h0,
                               int tid) {
  constexpr int kChunks = D / 8;
  for (int i = tid; i < 64 * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t row = tile_row(p, grp, h0, r);
    cp_async_16(tile + swz<D>(r, c * 8), row >= 0 ? src + row * D + c * 8 : src, row >= 0);
  }
}

// Gather the rows of kKeys slots from slot0 on (zeros for unused slots).
template <int D, int kKeys, int kThreads>
__device__ void gather_keys(bf16* tile, const bf16* src, const KeyList& list, int slot0, int tid) {
  constexpr int kChunks = D / 8;
  for (int i = tid; i < kKeys * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int key = list.key(slot0 + r);
    cp_async_16(tile + swz<D>(r, c * 8), key >= 0 ? src + int64_t(key) * D + c * 8 : src, key >= 0);
  }
}

// Thread tid's share of gathering a swizzled kRows-row tile: row tid / (kThreads / kRows), whose
// key it is given (-1: zeros), its 64-column blocks [first_block, end_block).
template <int kDim, int kRows, int kThreads>
__device__ void gather_row_wgmma(bf16* tile, const bf16* src, int key, int tid, int first_block = 0,
                                 int end_block = kDim / 64) {
  constexpr int kThreadsPerRow = kThreads / kRows;
  static_assert(8 % kThreadsPerRow == 0, "a column block's chunks split evenly");
  const int row = tid / kThreadsPerRow;
  const bf16* from = key >= 0 ? src + int64_t(key) * kDim : nullptr;
  for (int chunk = first_block * 8 + tid % kThreadsPerRow; chunk < end_block * 8;
       chunk += kThreadsPerRow) {
    cp_async_16(tile + swizzled_offset<kRows>(row, chunk), from ? from + chunk * 8 : tile,
                from != nullptr);
  }
}

// Gathers the rows of kRows slots from slot0 into a swizzled kRows-row tile (zeros for unused
// slots): each thread serves one row, so it reads one index per tile.
template <int kDim, int kRows, int kThreads>
__device__ void gather_rows_wgmma(bf16* tile, const bf16* src, const KeyList& list, int slot0,
                                  int tid) {
  constexpr int kThreadsPerRow = kThreads / kRows;
  gather_row_wgmma<kDim, kRows, kThreads>(tile, src, list.key(slot0 + tid / kThreadsPerRow), tid);
}

// The 64 rows of a block's tile (query grp, heads h0..) into a swizzled tile (zeros outside).
template <int kDim, int kThreads>
__device__ void load_block_rows(bf16* tile, const bf16* src, const Problem& p, int grp, int h0,
                                int tid) {
  load_rows_async<kDim, 64>(tile, 0, 64, tid, kThreads, [&](int r) -> const bf16* {
    const int64_t row = tile_row(p, grp, h0, r);
    return row >= 0 ? src + row * kDim : nullptr;
  });
}

// The output accumulators of the wgmma forwards: chunks of one product's N each.
template <int kChunks, int kN>
__device__ __forceinline__ void clear_accumulators(float (&acc)[kChunks][kN]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[c][i] = 0.f;
  }
}

// Multiplies the accumulators of the thread's two rows (ra: i % 4 < 2, rb: the others) by a, b.
template <int kChunks, int kN>
__device__ __forceinline__ void scale_rows(float (&acc)[kChunks][kN], float a, float b) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[c][i] *= i % 4 < 2 ? a : b;
  }
}

// Two adjacent output columns of a row (nothing for rows outside the problem, -1).
__device__ __forceinline__ void store_pair(bf16* out, int64_t row, int dim, int col, float x,
                                           float y) {
  if (row >= 0) *reinterpret_cast<uint32_t*>(out + row * dim + col) = pack_bf16(x, y);
}

}  // namespace hyscale::cuda::attn
