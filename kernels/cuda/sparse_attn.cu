// CUDA sparse MQA attention: forward (online softmax, LSE out) and backward (dq; dkey and dvalue
// accumulated into the shared keys), with query grouping. docs/sparse_attn.md has the why.
//
// Block tile (sparse_attn_traits.cuh): 64 rows = G adjacent queries x HB heads. The block's key
// list is its query's selected slots (G = 1) or the sorted union of its G queries' keys with a
// G-bit mask per entry (G > 1, built by build_union_kernel); a row sees an entry only when its
// query's bit is set, so every row attends exactly its own selected set.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cluster.cuh"
#include "kernels/cuda/fixed_point_accumulate.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sparse_attn_cuda.h"
#include "kernels/cuda/sparse_attn_mma.cuh"
#include "kernels/cuda/sparse_attn_traits.cuh"
#include "kernels/cuda/warp_specialization.cuh"

namespace hyscale::cuda {
namespace {

using bf16 = __nv_bfloat16;
using namespace attn;
constexpr float kLog2e = 1.4426950408889634f;

void check(cudaError_t status, const char* what) {
  throw_on_error(status, "hyscale::sparse_attn (CUDA)", what);
}

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
__device__ BlockTile tile_of(const Problem& p, int item) {
  const int head_blocks = (p.heads + p.hb - 1) / p.hb;
  return {item / head_blocks, item % head_blocks * p.hb};
}
__device__ BlockTile block_tile(const Problem& p) {
  return tile_of(p, static_cast<int>(blockIdx.x));
}

__device__ KeyList key_list(const Problem& p, int grp) {
  if (p.group == 1) return {p.indices + int64_t(grp) * p.topk, nullptr, p.ucount[grp]};
  return {p.ukeys + grp * p.cap, p.umask + grp * p.cap, p.ucount[grp]};
}

// Global row (query * H + head) of tile row r, or -1 when the row lies outside the problem.
__device__ int64_t tile_row(const Problem& p, int grp, int h0, int r) {
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

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// The forward kernels split a tile's columns (keys) between two halves of the block: a thread's
// two rows (ra, rb) get their per-tile maxima and final sums from both halves through
// `halves[2][64]` in shared memory. Both helpers below hold a block barrier.

// The barrier of the helpers below: the whole block, or (warp-specialized kernels) the threads
// that hold the rows.
struct BlockBarrier {
  __device__ void operator()() const { __syncthreads(); }
};

// Publishes this half's quad-reduced values of the thread's two rows, then waits for the other.
template <class Barrier = BlockBarrier>
__device__ __forceinline__ void publish_rows(float (*halves)[64], int half, int ra, int rb, float a,
                                             float b, int lane, Barrier barrier = {}) {
  if (lane % 4 == 0) {
    halves[half][ra] = a;
    halves[half][rb] = b;
  }
  barrier();
}

// What moving a row's running maximum (log2 units) to new_max multiplies its old sums and
// accumulators by: 1 while the row has seen nothing (its maximum stays -inf).
__device__ __forceinline__ float rescale_factor(float old_max, float new_max) {
  return new_max == -INFINITY ? 1.f : exp2f(old_max - new_max);
}
// 2^x in one MUFU.EX2: exp2f without fast math adds a denormal fix-up around it; probabilities
// below 2^-126 contribute nothing to the sums.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// The base a row's scores are taken against: 0 while it has seen nothing, so its probabilities
// stay exactly 0.
__device__ __forceinline__ float softmax_base(float new_max) {
  return new_max == -INFINITY ? 0.f : new_max;
}

// One online-softmax step: this tile's row maxima (mx_a, mx_b over this thread's columns) of
// both halves raise the running maxima m_a, m_b; gives the factors that rescale the old sums and
// accumulators, and the bases this tile's scores are taken against (0 while a row has seen
// nothing, so its probabilities stay exactly 0).
struct SoftmaxStep {
  float alpha_a, alpha_b, base_a, base_b;
};
__device__ __forceinline__ SoftmaxStep online_softmax_step(float (*halves)[64], int half, int ra,
                                                           int rb, int lane, float mx_a, float mx_b,
                                                           float& m_a, float& m_b) {
  publish_rows(halves, half, ra, rb, quad_max(mx_a), quad_max(mx_b), lane);
  const float new_a = fmaxf(m_a, fmaxf(halves[0][ra], halves[1][ra]));
  const float new_b = fmaxf(m_b, fmaxf(halves[0][rb], halves[1][rb]));
  SoftmaxStep step;
  step.alpha_a = rescale_factor(m_a, new_a);
  step.alpha_b = rescale_factor(m_b, new_b);
  step.base_a = softmax_base(new_a);
  step.base_b = softmax_base(new_b);
  m_a = new_a;
  m_b = new_b;
  return step;
}

// The final row sums (l over this thread's columns) of both halves: totals and their inverses
// (0 for rows that saw nothing).
struct RowTotals {
  float tot_a, tot_b, inv_a, inv_b;
};
template <class Barrier = BlockBarrier>
__device__ __forceinline__ RowTotals row_totals(float (*halves)[64], int half, int ra, int rb,
                                                int lane, float l_a, float l_b,
                                                Barrier barrier = {}) {
  publish_rows(halves, half, ra, rb, quad_sum(l_a), quad_sum(l_b), lane, barrier);
  RowTotals t;
  t.tot_a = halves[0][ra] + halves[1][ra];
  t.tot_b = halves[0][rb] + halves[1][rb];
  t.inv_a = t.tot_a > 0.f ? 1.f / t.tot_a : 0.f;
  t.inv_b = t.tot_b > 0.f ? 1.f / t.tot_b : 0.f;
  return t;
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

// lse (natural log) of a row from its running maximum (log2 units) and sum.
__device__ __forceinline__ void write_lse(float* lse, int64_t row, float max_log2, float total) {
  constexpr float kLn2 = 0.6931471805599453f;
  if (row >= 0) lse[row] = total > 0.f ? (max_log2 + log2f(total)) * kLn2 : -INFINITY;
}

// ---------------------------------------------------------------------------------------------
// Forward. Warp (rw, cw): rows 16 rw .. 16 rw + 15; S for keys 32 cw .. 32 cw + 31 of the tile,
// O for value columns cw * d_v/2 ... Row maxima and sums are combined across the two column
// warps through shared memory; P goes through shared memory (bf16) to the P V product.
// K and V tiles are single-buffered but loaded one phase ahead: K(j+1) streams in during the
// softmax and P V of tile j, V(j+1) during Q K^T of tile j+1.

struct FwdOut {
  bf16* out;
  float* lse;
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) sparse_attn_fwd_kernel(Problem p, FwdOut o_) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kFwdKeys, T = Tr::kThreads;
  constexpr int kVTiles = DV / 2 / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + 64 * DQ;
  bf16* sv = sk + BK * DQ;
  bf16* sp = sv + BK * DV;
  __shared__ float red[2][64];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, rw = warp & 3, cw = warp >> 2;
  const auto [grp, h0] = block_tile(p);
  const KeyList list = key_list(p, grp);
  load_tile_rows<DQ, T>(sq, p.q, p, grp, h0, tid);
  gather_keys<DQ, BK, T>(sk, p.key, list, 0, tid);
  cp_async_commit();
  gather_keys<DV, BK, T>(sv, p.value, list, 0, tid);
  cp_async_commit();

  const int ra = rw * 16 + (lane >> 2), rb = ra + 8;
  const int ga = ra / p.hb, gb = rb / p.hb;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  float o[kVTiles][4];
#pragma unroll
  for (int i = 0; i < kVTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  const int tiles = static_cast<int>(ceil_div(list.count, BK));
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<1>();
    __syncthreads();
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll 4
    for (int k0 = 0; k0 < DQ; k0 += 16) {
      uint32_t a[4], b[4];
      load_a<DQ>(a, sq, rw * 16, k0, lane);
#pragma unroll
      for (int nt = 0; nt < 4; nt += 2) {
        load_b_nk<DQ>(b, sk, cw * 32 + nt * 8, k0, lane);
        mma_bf16(s[nt], a, b[0], b[1]);
        mma_bf16(s[nt + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();
    if (j + 1 < tiles) gather_keys<DQ, BK, T>(sk, p.key, list, (j + 1) * BK, tid);
    cp_async_commit();

    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = j * BK + cw * 32 + nt * 8 + 2 * (lane & 3) + (e & 1);
        const bool seen = list.sees(slot, e < 2 ? ga : gb);
        s[nt][e] = seen ? s[nt][e] * p.scale_log2 : -INFINITY;
      }
      mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
    }
    const auto [alpha_a, alpha_b, base_a, base_b] =
        online_softmax_step(red, cw, ra, rb, lane, mx_a, mx_b, m_a, m_b);
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float p0 = exp2f(s[nt][0] - base_a), p1 = exp2f(s[nt][1] - base_a);
      const float p2 = exp2f(s[nt][2] - base_b), p3 = exp2f(s[nt][3] - base_b);
      sum_a += p0 + p1;
      sum_b += p2 + p3;
      const int col = cw * 32 + nt * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(sp + swz<BK>(ra, col)) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(sp + swz<BK>(rb, col)) = pack_bf16(p2, p3);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int i = 0; i < kVTiles; ++i) {
      o[i][0] *= alpha_a;
      o[i][1] *= alpha_a;
      o[i][2] *= alpha_b;
      o[i][3] *= alpha_b;
    }
    cp_async_wait<1>();
    __syncthreads();
    mma_rows_by_kn<BK, DV>(o, sp, rw * 16, sv, cw * (DV / 2), lane);
    __syncthreads();
    if (j + 1 < tiles) gather_keys<DV, BK, T>(sv, p.value, list, (j + 1) * BK, tid);
    cp_async_commit();
  }
  cp_async_wait<0>();

  const auto [tot_a, tot_b, inv_a, inv_b] = row_totals(red, cw, ra, rb, lane, l_a, l_b);
  const int64_t row_a = tile_row(p, grp, h0, ra), row_b = tile_row(p, grp, h0, rb);
#pragma unroll
  for (int nt = 0; nt < kVTiles; ++nt) {
    const int col = cw * (DV / 2) + nt * 8 + 2 * (lane & 3);
    store_pair(o_.out, row_a, DV, col, o[nt][0] * inv_a, o[nt][1] * inv_a);
    store_pair(o_.out, row_b, DV, col, o[nt][2] * inv_b, o[nt][3] * inv_b);
  }
  if (cw == 0 && (lane & 3) == 0) {
    write_lse(o_.lse, row_a, m_a, tot_a);
    write_lse(o_.lse, row_b, m_b, tot_b);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward on wgmma (SparseAttnWgmmaTraits): one block per (query, 64 heads), two warpgroups.
// Per 64-key tile j: S = Q K^T with warpgroup w taking keys 32w.. (m64n32, both operands in shared
// memory); the row maxima of both halves meet in shared memory; P (bf16) goes to shared memory;
// warpgroup w adds P V (m64 x d_v/2, V read MN-major) into its value columns.

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

// Separate values: K(j+1) streams in during the softmax and P V of tile j, V(j+1) during S of
// tile j+1, as in the mma.sync kernel. (Values inside the keys take the warp-specialized kernel
// below.)
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_fwd_wgmma_kernel(Problem p, FwdOut o_) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kKeys, T = Tr::kThreads;
  constexpr int kSKeys = Tr::kKeysPerWarpgroup, kPvN = Tr::kPvN, kChunks = Tr::kPvChunks;
  // No static shared memory: the tiles start at the 1 KB-aligned dynamic window.
  extern __shared__ __align__(1024) unsigned char tiles_raw[];
  bf16* sq = reinterpret_cast<bf16*>(tiles_raw);
  bf16* sk = reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes);
  bf16* sv = reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes + Tr::kKBytes);
  bf16* sp = reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes + Tr::kKBytes + Tr::kVBytes);
  auto* row_max = reinterpret_cast<float(*)[64]>(tiles_raw + Tr::kQBytes + Tr::kKBytes +
                                                 Tr::kVBytes + Tr::kPBytes);
  auto* row_sum = row_max + 2;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const auto [grp, h0] = block_tile(p);
  const KeyList list = key_list(p, grp);
  load_block_rows<DQ, T>(sq, p.q, p, grp, h0, tid);
  gather_rows_wgmma<DQ, BK, T>(sk, p.key, list, 0, tid);
  cp_async_commit();
  gather_rows_wgmma<DV, BK, T>(sv, p.value, list, 0, tid);
  cp_async_commit();

  // This thread's accumulator rows (both warpgroups hold all 64 rows).
  const int ra = warp * 16 + lane / 4, rb = ra + 8;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  float o[kChunks][kPvN / 2];
  clear_accumulators(o);

  const int tiles = static_cast<int>(ceil_div(list.count, BK));
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<1>();  // Q and K(j) have landed (V(j) may still be in flight)
    fence_async_shared();
    __syncthreads();
    float s[kSKeys / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DQ / 16; ++ks) {
      Wgmma<kSKeys>::run(s, matrix_descriptor<64>(sq, 0, ks),
                         matrix_descriptor<64>(sk, wg * kSKeys, ks), ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(s);
    __syncthreads();  // both warpgroups are done with K(j)
    if (j + 1 < tiles) gather_rows_wgmma<DQ, BK, T>(sk, p.key, list, (j + 1) * BK, tid);
    cp_async_commit();

    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSKeys / 2; ++i) {
      const int slot = j * BK + wg * kSKeys + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
      s[i] = list.sees(slot, 0) ? s[i] * p.scale_log2 : -INFINITY;
      if (i % 4 < 2) {
        mx_a = fmaxf(mx_a, s[i]);
      } else {
        mx_b = fmaxf(mx_b, s[i]);
      }
    }
    const auto [alpha_a, alpha_b, base_a, base_b] =
        online_softmax_step(row_max, wg, ra, rb, lane, mx_a, mx_b, m_a, m_b);
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int i = 0; i < kSKeys / 2; i += 4) {
      const float p0 = exp2f(s[i] - base_a), p1 = exp2f(s[i + 1] - base_a);
      const float p2 = exp2f(s[i + 2] - base_b), p3 = exp2f(s[i + 3] - base_b);
      sum_a += p0 + p1;
      sum_b += p2 + p3;
      const int col = wg * kSKeys + 8 * (i / 4) + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(sp + swizzled_offset<64>(ra, col / 8) + col % 8) =
          pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(sp + swizzled_offset<64>(rb, col / 8) + col % 8) =
          pack_bf16(p2, p3);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    scale_rows(o, alpha_a, alpha_b);
    cp_async_wait<1>();    // V(j) has landed (K(j+1) may not have)
    fence_async_shared();  // the P stores and V(j) are read by wgmma
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        Wgmma<kPvN, 1>::run(o[c], matrix_descriptor<64>(sp, 0, ks),
                            mn_major_descriptor<64>(sv, wg * (DV / 2) + c * kPvN, ks * 16), 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
    __syncthreads();  // both warpgroups are done with V(j) and P
    if (j + 1 < tiles) gather_rows_wgmma<DV, BK, T>(sv, p.value, list, (j + 1) * BK, tid);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // Each warpgroup summed P over its own keys: the row sums meet in shared memory.
  const auto [tot_a, tot_b, inv_a, inv_b] = row_totals(row_sum, wg, ra, rb, lane, l_a, l_b);
  const int64_t row_a = tile_row(p, grp, h0, ra), row_b = tile_row(p, grp, h0, rb);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kPvN / 2; i += 4) {
      const int col = wg * (DV / 2) + c * kPvN + 8 * (i / 4) + 2 * (lane % 4);
      store_pair(o_.out, row_a, DV, col, o[c][i] * inv_a, o[c][i + 1] * inv_a);
      store_pair(o_.out, row_b, DV, col, o[c][i + 2] * inv_b, o[c][i + 3] * inv_b);
    }
  }
  if (wg == 0 && lane % 4 == 0) {
    write_lse(o_.lse, row_a, m_a, tot_a);
    write_lse(o_.lse, row_b, m_b, tot_b);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward with values inside the keys, warp-specialized (SparseAttnLatentTraits). Per pair of
// 64-key blocks (b0 = 2i in buffer 0, b1 = 2i + 1 in buffer 1), with M the running row
// references (below) that both consumers share:
//   warpgroup 0: M0 = raised_max(M, rowmax S0), published before P0 of S0 against it; O_left +=
//     P0 V0 (P0 from registers); once warpgroup 1 has published M1, rescales O_left and P0 to M1
//     (if a row of the warp moved), stores P0 for warpgroup 1 and adds O_left += P1 V1 while S of
//     the next pair's b0 runs;
//   warpgroup 1: M1 = raised_max(M0, rowmax S1), published before P1 of S1 against it; O_right +=
//     P1 V1 (from registers), stores P1, O_right += P0 V0.
// So at the end of every pair both consumers' accumulators and sums are relative to the same
// references; each sums P over its own blocks, and the two sums meet at the end.

// A row's reference is not its running maximum: it moves only when a block's maximum exceeds it
// by more than kMaxLag (log2 units). Its probabilities stay below 2^kMaxLag, which fp32 sums and
// bf16 P hold with room to spare, and after a row's first blocks its accumulators are almost
// never rescaled (a warp skips the multiplications when none of its rows moved: 128 a thread,
// twice a pair in warpgroup 0, on the path from S to P V). The sums and the LSE are taken
// against the same references, so the result is the same softmax.
constexpr float kMaxLag = 8.f;
__device__ __forceinline__ float raised_max(float reference, float block_max) {
  return block_max > reference + kMaxLag ? block_max : reference;
}
__device__ __forceinline__ bool warp_moved(float old_a, float new_a, float old_b, float new_b) {
  return __any_sync(0xffffffff, old_a != new_a || old_b != new_b);
}

// Shared memory after the tiles.
struct LatentSync {
  uint64_t q_ready[2];   // [half: 0 left, 1 right] of Q's column blocks, as the K buffers' halves
  uint64_t q_free;       // both consumers' last S of an item has read Q
  uint64_t ready[2][2];  // [buffer][half: 0 left, 1 right]: the producer's copies have landed
  uint64_t free[2][2];   // [buffer][half]: its last reader is done with it
  uint64_t valid_ready;  // the producer has written `valid` for the pair
  // [buffer][slot byte]: 1 where the block's key slot holds a key, at the byte a consumer thread
  // reads it from (latent_valid_byte): a thread's 16 slots are 16 contiguous bytes.
  alignas(16) uint8_t valid[2][64];
  float row_max[64];     // the running maxima, handed from one consumer to the other
  float row_sum[2][64];  // both consumers' final sums
};

// Where slot `slot` (< 64) of a block lies in LatentSync::valid: thread lane's score columns are
// 8 j + 2 (lane % 4) + e (j < 8, e < 2, the wgmma accumulator layout), at byte 16 (lane % 4) +
// 2 j + e, so one 16-byte load gives a thread all of its columns in bit order.
__device__ __forceinline__ int latent_valid_byte(int slot) {
  return 16 * (slot % 8 / 2) + 2 * (slot / 8) + slot % 2;
}

// Named barriers between the two consumer warpgroups.
enum LatentBarrier : int { kMax0Ready = 1, kMax1Ready, kP0Ready, kP1Ready, kSumsReady };

struct ConsumerBarrier {
  __device__ void operator()() const { named_barrier_sync(kSumsReady, 256); }
};

// An item's pairs of 64-key blocks (its slots up to the last valid one), and the block's next
// item after `item` that has any (>= items: none). Items without pairs (every slot -1) take no
// part in the pipeline; the consumers write their rows as empty.
template <int BK>
__device__ int pairs_of(const KeyList& list) {
  return static_cast<int>(ceil_div(ceil_div(list.count, BK), 2));
}
template <int BK>
__device__ int item_pairs(const Problem& p, int item) {
  return pairs_of<BK>(key_list(p, tile_of(p, item).grp));
}
template <int BK>
__device__ int next_busy_item(const Problem& p, int item, int items) {
  do {
    item += static_cast<int>(gridDim.x);
  } while (item < items && item_pairs<BK>(p, item) == 0);
  return item;
}

// The producer warpgroup: per item its Q, then per pair the four half buffers in the order their
// readers free them. The block is persistent: its items are blockIdx.x + i gridDim.x, and the
// producer runs on into the next item as buffers are freed (Q once both consumers' last S of an
// item has read it), so an item's first blocks land while the previous one's last run.
// Thread t copies the 16-byte chunk t % 8 of every 64-column block of rows t / 8 + 16 i, so its
// shared-memory offsets inside a block are constants (those rows agree mod 8: one swizzle).
template <class Tr>
__device__ void produce_latent_blocks(const Problem& p, bf16* sq, bf16* const (&kbuf)[2],
                                      LatentSync& sync, int items) {
  constexpr int DQ = Tr::kDimQk, BK = Tr::kKeys, kRowsPerThread = BK / 16;
  constexpr int L = Tr::kLeftBlocks, C = Tr::kColumnBlocks;
  const int t = threadIdx.x % 128, chunk = t % 8, row0 = t / 8;
  const uint64_t policy = l2_evict_last_policy();
  const int offset = row0 * 64 + (chunk ^ (row0 % 8)) * 8;  // = swizzled_offset<BK>(row0, chunk)
  // The slots of one pair of the block's items: a cursor that moves on a pair at a time and, past
  // an item's last pair, to the next busy item's first (no slots past the block's last item), so
  // an item's end costs one lookup and a pair a few additions.
  struct PairSlots {
    const int32_t* keys;
    int count;  // slots from keys on (<= 0: none)
    int pairs_left, item;
    __device__ int key(int slot) const { return slot < count ? keys[slot] : -1; }
  };
  auto start_item = [&](PairSlots& c, int item) {
    c.item = item;
    const KeyList list = item < items ? key_list(p, tile_of(p, item).grp) : KeyList{};
    c.keys = list.keys;
    c.count = list.count;
    c.pairs_left = pairs_of<BK>(list);
  };
  auto advance = [&](PairSlots& c) {
    if (--c.pairs_left > 0) {
      c.keys += 2 * BK;
      c.count -= 2 * BK;
    } else {
      start_item(c, next_busy_item<BK>(p, c.item, items));
    }
  };
  // Thread's rows of a pair: key[b][i] is row row0 + 16 i of block b (-1: none, zero-filled).
  using PairKeys = int[2][kRowsPerThread];
  auto load_keys = [&](const PairSlots& slots, PairKeys& keys) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) keys[b][i] = slots.key(b * BK + row0 + 16 * i);
    }
  };
  // Column blocks [first_block, end_block) of this thread's rows of a 64-row tile: row row0 + 16 i
  // from src(i) where valid(i), else zeros, under the L2 policy l2.
  auto copy_rows = [&](bf16* tile, auto src, auto valid, int first_block, int end_block,
                       uint64_t l2) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bf16* from = src(i);
#pragma unroll
      for (int cb = first_block; cb < end_block; ++cb) {
        cp_async_16_l2(tile + cb * BK * 64 + 16 * i * 64 + offset, from + cb * 64, valid(i), l2);
      }
    }
  };
  auto copy_half = [&](bf16* tile, const int(&keys)[kRowsPerThread], int first_block,
                       int end_block) {
    copy_rows(
        tile, [&](int i) { return p.key + int64_t(max(keys[i], 0)) * DQ + chunk * 8; },
        [&](int i) { return keys[i] >= 0; }, first_block, end_block, policy);
  };
  // An item's 64 Q rows are one contiguous range (G = 1, whole head blocks), copied like the
  // gathers' rows, so this thread's offsets are constants too.
  auto q_of = [&](int item) {
    const auto [grp, h0] = tile_of(p, item);
    return p.q + tile_row(p, grp, h0, 0) * DQ;
  };
  const uint64_t read_once = l2_evict_first_policy();
  auto copy_q_half = [&](const bf16* q_rows, int half) {
    copy_rows(
        sq, [&](int i) { return q_rows + int64_t(row0 + 16 * i) * DQ + chunk * 8; },
        [](int) { return true; }, half == 0 ? 0 : L, half == 0 ? L : C, read_once);
    cp_async_arrive(&sync.q_ready[half]);
  };
  // Indices are read a pair before their copies: the producer never waits for an index load
  // between a free buffer and its copy. Q comes in halves beside the K halves its products pair
  // with (Q left, buffer 0 left, Q right, buffer 1 right). The rows are not prefetched into L2:
  // the copies of the pair in flight hide the gathers' latency, and prefetches issued ahead of
  // them made the forward 3-4 % slower (docs/performance.md, section 7).
  const int first_item =
      next_busy_item<BK>(p, static_cast<int>(blockIdx.x) - static_cast<int>(gridDim.x), items);
  PairSlots ahead;
  start_item(ahead, first_item);
  PairKeys keys;
  load_keys(ahead, keys);
  advance(ahead);
  int round = 0;  // pairs so far, over all items: the barriers' phases
  // i counts the busy items (Q's phases).
  for (int i = 0, item = first_item; item < items; ++i, item = next_busy_item<BK>(p, item, items)) {
    const bf16* q_rows = q_of(item);
    const int pairs = item_pairs<BK>(p, item);
    mbarrier_wait(&sync.q_free, (i & 1) ^ 1);
    copy_q_half(q_rows, 0);
    for (int pair = 0; pair < pairs; ++pair, ++round) {
      PairKeys next;
      load_keys(ahead, next);
      advance(ahead);
      const uint32_t parity = (round & 1) ^ 1;  // the readers' previous round
      mbarrier_wait(&sync.free[0][0], parity);
      copy_half(kbuf[0], keys[0], 0, L);
      cp_async_arrive(&sync.ready[0][0]);
      if (pair == 0) copy_q_half(q_rows, 1);
      mbarrier_wait(&sync.free[1][1], parity);
      copy_half(kbuf[1], keys[1], L, C);
      cp_async_arrive(&sync.ready[1][1]);
      // Both consumers have masked the previous pair (each frees a half after it), so its
      // validity bytes can be replaced.
      if (chunk == 0) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
#pragma unroll
          for (int r = 0; r < kRowsPerThread; ++r) {
            sync.valid[b][latent_valid_byte(row0 + 16 * r)] = keys[b][r] >= 0;
          }
        }
      }
      mbarrier_arrive(&sync.valid_ready);
      mbarrier_wait(&sync.free[0][1], parity);
      copy_half(kbuf[0], keys[0], L, C);
      cp_async_arrive(&sync.ready[0][1]);
      mbarrier_wait(&sync.free[1][0], parity);
      copy_half(kbuf[1], keys[1], 0, L);
      cp_async_arrive(&sync.ready[1][0]);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) keys[b][r] = next[b][r];
      }
    }
  }
}

// Consumer warpgroup kWg (the schedule above), over the block's items. ptile[c] is where consumer
// c's P goes for the other.
template <class Tr, int kWg>
__device__ void consume_latent_blocks(const Problem& p, bf16* sq, bf16* const (&kbuf)[2],
                                      bf16* const (&ptile)[2], LatentSync& sync, int items,
                                      const FwdOut& o_) {
  constexpr int DV = Tr::kDimV, BK = Tr::kKeys, kPvN = Tr::kPvN, kChunks = Tr::kPvChunks;
  static_assert(BK == 64, "LatentSync::valid holds 64-key blocks");
  constexpr int L = Tr::kLeftBlocks, C = Tr::kColumnBlocks, kPairThreads = Tr::kConsumerThreads;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int ra = warp * 16 + lane / 4, rb = ra + 8;
  const int columns = kWg * (DV / 2);  // this warpgroup's value columns
  float m_a, m_b, l_a, l_b;
  float o[kChunks][kPvN / 2];
  float s[BK / 2];          // S, then P, of this warpgroup's block
  uint32_t pa[BK / 16][4];  // P (bf16) as the A operands of the k16 steps of P V

  // S of this warpgroup's block of `pair`, one half of the K buffer (0 left, 1 right) at a time,
  // each its own commit group: the half this warpgroup frees first is filled first, and the
  // first half's product runs while the second is still landing.
  auto issue_s_half = [&](int pair, int half, bool overwrite) {
    const uint64_t q0 = descriptor_here(matrix_descriptor<64>(sq, 0, 0));
    const uint64_t k0 = descriptor_here(matrix_descriptor<BK>(kbuf[kWg], 0, 0));
    mbarrier_wait(&sync.ready[kWg][half], pair & 1);
    fence_async_shared();
    // (No compiler fence on s here: for warpgroup 0 this is inside the P V's pipeline stage, and
    // ptxas serializes the stage when a non-wgmma instruction defines an accumulator in it.)
    wgmma_fence();
    const int first = half == 0 ? 0 : L, end = half == 0 ? L : C;
#pragma unroll
    for (int ks = first * 4; ks < end * 4; ++ks) {
      Wgmma<BK>::run(s, advance_descriptor<64>(q0, ks), advance_descriptor<BK>(k0, ks),
                     !(overwrite && ks == first * 4));
    }
    wgmma_commit();
  };
  // Which of this thread's 16 score columns of the pair's block in its buffer its query
  // selected (bit 2 j + e: column 8 j + 2 (lane % 4) + e), from the bytes the producer wrote.
  auto selected_columns = [&](int pair) {
    mbarrier_wait(&sync.valid_ready, pair & 1);
    const uint4 bytes = *reinterpret_cast<const uint4*>(&sync.valid[kWg][16 * (lane % 4)]);
    const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) bits |= ((words[k / 4] >> (8 * (k % 4))) & 1u) << k;
    return bits;
  };
  // Masks S (finished) by `selected` and takes it to log2 units; gives its row maxima.
  auto mask_scores = [&](uint32_t selected, float& mx_a, float& mx_b) {
    mx_a = -INFINITY;
    mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) {
      const bool seen = (selected >> (2 * (i / 4) + i % 2)) & 1;
      s[i] = seen ? s[i] * p.scale_log2 : -INFINITY;
      if (i % 4 < 2) {
        mx_a = fmaxf(mx_a, s[i]);
      } else {
        mx_b = fmaxf(mx_b, s[i]);
      }
    }
    mx_a = quad_max(mx_a);
    mx_b = quad_max(mx_b);
  };
  // P against the new maxima (0 while a row has seen nothing); O and the sums follow them.
  auto softmax = [&](float new_a, float new_b) {
    const float alpha_a = rescale_factor(m_a, new_a), alpha_b = rescale_factor(m_b, new_b);
    const float base_a = softmax_base(new_a), base_b = softmax_base(new_b);
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) {
      s[i] = exp2_ftz(s[i] - (i % 4 < 2 ? base_a : base_b));
      if (i % 4 < 2) {
        sum_a += s[i];
      } else {
        sum_b += s[i];
      }
    }
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[ks][r] = pack_bf16(s[8 * ks + 2 * r], s[8 * ks + 2 * r + 1]);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    if (warp_moved(m_a, new_a, m_b, new_b)) scale_rows(o, alpha_a, alpha_b);
    m_a = new_a;
    m_b = new_b;
  };
  // The new maxima for the other consumer, before this one's exponentials: its softmax need not
  // wait for them.
  auto publish_max = [&](float new_a, float new_b) {
    if (lane % 4 == 0) {
      sync.row_max[ra] = new_a;
      sync.row_max[rb] = new_b;
    }
  };
  // pa again from P times per-row factors (once the own P V has read it).
  auto rescale_p = [&](float c_a, float c_b) {
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float c = r % 2 == 0 ? c_a : c_b;
        pa[ks][r] = pack_bf16(s[8 * ks + 2 * r] * c, s[8 * ks + 2 * r + 1] * c);
      }
    }
  };
  // pa into this warpgroup's P tile for the other one, one stmatrix a k16 step: pa[ks][m] is the
  // 8 x 8 matrix of rows 16 warp + 8 (m % 2) .., columns 16 ks + 8 (m / 2) .., and lane gives
  // row lane % 8 of matrix lane / 8.
  auto store_p = [&]() {
    const int m = lane / 8, row = warp * 16 + (m % 2) * 8 + lane % 8;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      stmatrix_x4(ptile[kWg] + swizzled_offset<64>(row, 2 * ks + m / 2), pa[ks]);
    }
    fence_async_shared();  // read by the other warpgroup's wgmma
  };
  // O += P V over buffer `buffer`'s rows and this warpgroup's value columns: P from registers
  // (own) or from the other warpgroup's tile.
  auto pv_own = [&](int buffer) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
    wgmma_fence();
    const uint64_t v0 = descriptor_here(mn_major_descriptor<BK>(kbuf[buffer], columns, 0));
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        WgmmaRegA<kPvN, 1>::run(o[c], pa[ks], advance_mn_major<BK>(v0, c * kPvN, ks * 16));
      }
    }
    wgmma_commit();
  };
  auto pv_other = [&](int buffer) {
    wgmma_fence();
    const uint64_t p0 = descriptor_here(matrix_descriptor<64>(ptile[1 - kWg], 0, 0));
    const uint64_t v0 = descriptor_here(mn_major_descriptor<BK>(kbuf[buffer], columns, 0));
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        Wgmma<kPvN, 1>::run(o[c], advance_descriptor<64>(p0, ks),
                            advance_mn_major<BK>(v0, c * kPvN, ks * 16), 1);
      }
    }
    wgmma_commit();
  };
  auto retire_pv = [&]() {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) fence_operands(pa[ks]);
  };

  // The item's output, straight from the accumulators (Q's tile, which staged it before, is
  // already loading the next item's Q): per 32 columns of a row the four lanes of a quad hold
  // 2 columns of each 8, and after a 4 x 4 transpose of those words across the quad (two
  // exchanges) each lane holds 8 adjacent columns, one 16-byte store.
  auto store_output = [&](bf16* out_a, bf16* out_b, float inv_a, float inv_b) {
    const bool hi = lane & 2, odd = lane & 1;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int g = 0; g < kPvN / 32; ++g) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float inv = r == 0 ? inv_a : inv_b;
          uint32_t w[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float* x = &o[c][16 * g + 4 * j + 2 * r];
            w[j] = pack_bf16(x[0] * inv, x[1] * inv);
          }
          // Word j of lane q is columns 8 j + 2 q ..; afterwards word j is columns 8 q + 2 j ..
          uint32_t x0 = __shfl_xor_sync(0xffffffff, hi ? w[0] : w[2], 2);
          uint32_t x1 = __shfl_xor_sync(0xffffffff, hi ? w[1] : w[3], 2);
          if (hi) {
            w[0] = x0, w[1] = x1;
          } else {
            w[2] = x0, w[3] = x1;
          }
          x0 = __shfl_xor_sync(0xffffffff, odd ? w[0] : w[1], 1);
          x1 = __shfl_xor_sync(0xffffffff, odd ? w[2] : w[3], 1);
          if (odd) {
            w[0] = x0, w[2] = x1;
          } else {
            w[1] = x0, w[3] = x1;
          }
          bf16* row = r == 0 ? out_a : out_b;
          *reinterpret_cast<uint4*>(row + columns + c * kPvN + 32 * g + 8 * (lane % 4)) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  };

  const int stride = static_cast<int>(gridDim.x);
  // Warpgroup 0: whether S of an item's first pair already ran beside the previous item's end,
  // and that pair's validity bits.
  bool next_s_done = false;
  uint32_t selected = 0;
  int round = 0;  // pairs so far, over all items: the barriers' phases
  // i counts the busy items (Q's phases).
  for (int i = 0, item = static_cast<int>(blockIdx.x); item < items; item += stride) {
    const int pairs = item_pairs<BK>(p, item);
    m_a = m_b = -INFINITY;
    l_a = l_b = 0.f;
    // The zeros of o stay before the first wgmma (inside its stage they would serialize it).
    clear_accumulators(o);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
    if constexpr (kWg == 0) {
      const bool busy_after = next_busy_item<BK>(p, item, items) < items;
      // No wgmma is in flight across the loop's back edge or a merge of paths: ptxas serializes
      // a stage in which a non-wgmma instruction reads or defines an accumulator, register moves
      // at a merge included. So the loop leaves from its middle, and S of the next pair, issued
      // while P1 V1 runs, is waited for before the back edge. The next pair may be the next
      // item's first: its S then runs beside this item's last P1 V1, before the output.
      if (pairs > 0) {
        if (!next_s_done) {
          mbarrier_wait(&sync.q_ready[0], i & 1);
          issue_s_half(round, 0, true);
          mbarrier_wait(&sync.q_ready[1], i & 1);
          issue_s_half(round, 1, false);
          selected = selected_columns(round);
          wgmma_wait<0>();
          fence_accumulators(s);
        }
        for (int pair = 0;; ++pair) {
          const bool last = pair + 1 == pairs;
          if (last) mbarrier_arrive(&sync.q_free);  // its last S has read Q
          float mx_a, mx_b;
          mask_scores(selected, mx_a, mx_b);
          const float m0_a = raised_max(m_a, mx_a), m0_b = raised_max(m_b, mx_b);
          publish_max(m0_a, m0_b);
          named_barrier_arrive(kMax0Ready, kPairThreads);
          softmax(m0_a, m0_b);
          pv_own(0);
          wgmma_wait<0>();
          retire_pv();
          mbarrier_arrive(&sync.free[0][0]);
          named_barrier_sync(kMax1Ready, kPairThreads);
          const float m1_a = sync.row_max[ra], m1_b = sync.row_max[rb];
          const bool moved = warp_moved(m_a, m1_a, m_b, m1_b);
          const float c_a = rescale_factor(m_a, m1_a), c_b = rescale_factor(m_b, m1_b);
          m_a = m1_a;
          m_b = m1_b;
          if (moved) rescale_p(c_a, c_b);
          store_p();
          named_barrier_arrive(kP0Ready, kPairThreads);
          l_a *= c_a;
          l_b *= c_b;
          if (moved) scale_rows(o, c_a, c_b);
          named_barrier_sync(kP1Ready, kPairThreads);
          if (last && !busy_after) {
            pv_other(1);
            wgmma_wait<0>();
            mbarrier_arrive(&sync.free[1][0]);
            next_s_done = false;
            break;
          }
          pv_other(1);
          if (last) mbarrier_wait(&sync.q_ready[0], (i + 1) & 1);
          issue_s_half(round + pair + 1, 0, true);
          wgmma_wait<1>();  // P1 V1: buffer 1's left half is free before S waits for the right
          mbarrier_arrive(&sync.free[1][0]);
          if (last) mbarrier_wait(&sync.q_ready[1], (i + 1) & 1);
          issue_s_half(round + pair + 1, 1, false);
          selected = selected_columns(round + pair + 1);
          wgmma_wait<0>();
          fence_accumulators(s);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
          if (last) {
            next_s_done = true;
            break;
          }
        }
      }
    } else {
      if (pairs > 0) {
        mbarrier_wait(&sync.q_ready[0], i & 1);
        mbarrier_wait(&sync.q_ready[1], i & 1);
      }
      for (int pair = 0; pair < pairs; ++pair) {
        issue_s_half(round + pair, 1, true);
        issue_s_half(round + pair, 0, false);
        const uint32_t selected = selected_columns(round + pair);
        wgmma_wait<0>();
        fence_accumulators(s);
        if (pair + 1 == pairs) mbarrier_arrive(&sync.q_free);
        float mx_a, mx_b;
        mask_scores(selected, mx_a, mx_b);
        named_barrier_sync(kMax0Ready, kPairThreads);
        const float m1_a = raised_max(sync.row_max[ra], mx_a);
        const float m1_b = raised_max(sync.row_max[rb], mx_b);
        __syncwarp();  // every lane has read M0 before its row's lane 0 overwrites it
        publish_max(m1_a, m1_b);
        named_barrier_arrive(kMax1Ready, kPairThreads);
        softmax(m1_a, m1_b);
        pv_own(1);
        store_p();
        named_barrier_sync(kP0Ready, kPairThreads);
        pv_other(0);
        named_barrier_arrive(kP1Ready, kPairThreads);
        wgmma_wait<1>();  // the own P V (fences after the last wait, as in warpgroup 0)
        mbarrier_arrive(&sync.free[1][1]);
        wgmma_wait<0>();
        retire_pv();
        mbarrier_arrive(&sync.free[0][1]);
      }
    }

    // Without pairs (every slot -1) the rows saw nothing: no sums to exchange.
    const RowTotals totals =
        pairs > 0 ? row_totals(sync.row_sum, kWg, ra, rb, lane, l_a, l_b, ConsumerBarrier{})
                  : RowTotals{0.f, 0.f, 0.f, 0.f};
    const auto [grp, h0] = tile_of(p, item);
    const int64_t first_row = tile_row(p, grp, h0, 0);  // G = 1, whole head blocks: rows exist
    if (kWg == 0 && lane % 4 == 0) {
      write_lse(o_.lse, first_row + ra, m_a, totals.tot_a);
      write_lse(o_.lse, first_row + rb, m_b, totals.tot_b);
    }
    store_output(o_.out + (first_row + ra) * DV, o_.out + (first_row + rb) * DV, totals.inv_a,
                 totals.inv_b);
    round += pairs;
    i += pairs > 0;
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_fwd_latent_kernel(Problem p, FwdOut o_) {
  static_assert(sizeof(LatentSync) <= Tr::kSmemBytes - Tr::kTilesBytes);
  extern __shared__ __align__(1024) unsigned char tiles_raw[];
  bf16* sq = reinterpret_cast<bf16*>(tiles_raw);
  bf16* const kbuf[2] = {reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes),
                         reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes + Tr::kKBytes)};
  bf16* p_tiles = reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes + 2 * Tr::kKBytes);
  bf16* const ptile[2] = {Tr::kPInKeyTail ? kbuf[0] + (Tr::kColumnBlocks - 1) * Tr::kKeys * 64
                                          : p_tiles + Tr::kPBytes / 2,
                          p_tiles};
  auto& sync = *reinterpret_cast<LatentSync*>(tiles_raw + Tr::kTilesBytes);
  const int wg = warpgroup_index();
  const int items = p.n * ((p.heads + p.hb - 1) / p.hb);
  if (threadIdx.x == 0) {
    for (int half = 0; half < 2; ++half) mbarrier_init(&sync.q_ready[half], 128);
    mbarrier_init(&sync.q_free, 256);
    for (int b = 0; b < 2; ++b) {
      for (int half = 0; half < 2; ++half) {
        mbarrier_init(&sync.ready[b][half], 128);
        mbarrier_init(&sync.free[b][half], 128);
      }
    }
    mbarrier_init(&sync.valid_ready, 128);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (wg == 2) {
    release_registers<Tr::kProducerRegisters>();
    produce_latent_blocks<Tr>(p, sq, kbuf, sync, items);
  } else {
    claim_registers<Tr::kConsumerRegisters>();
    if (wg == 0) {
      consume_latent_blocks<Tr, 0>(p, sq, kbuf, ptile, sync, items, o_);
    } else {
      consume_latent_blocks<Tr, 1>(p, sq, kbuf, ptile, sync, items, o_);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward: one kernel body, three modes. Per key tile of 32: S = Q K^T and dP = dO V^T (warp
// (rw, cw): rows 16 rw.., keys 16 cw..), P = exp(S - lse), dS = scale * P (dP - D) with
// D = rowsum(dO * O); P and dS go to shared memory (bf16). Then
//   kDq:       dQ += dS K, kept in registers (warp: rows 16 rw.., columns cw * d_qk/2 ..);
//   kDkv*:     dV_tile = P^T dO and dK_tile = dS^T Q (warp: keys 16 (w & 1).., column quarter
//              w >> 1), added into the shared keys: fp32 atomics (kDkvAtomic) or 64-bit
//              fixed-point integer atomics (kDkvFixed, deterministic).
enum BwdMode { kDq = 0, kDkvAtomic = 1, kDkvFixed = 2 };

struct BwdArgs {
  const bf16* grad_out;
  const float* lse;
  const float* delta;  // [N * H]
  bf16* grad_q;
  float* grad_key;
  float* grad_value;
  unsigned long long* fixed_key;
  unsigned long long* fixed_value;
  const float* amax;     // [3]: max |q|, max |dO|, max |value| (fixed-point scales)
  int resident_queries;  // queries the device runs at once (the latent backward's tile rotation)
};

// Fixed-point scales (fixed_point_accumulate.cuh) from bounds no partial sum can exceed:
//   |dvalue| <= N H max|dO|, |dkey| <= N H 2 d_v max|dO| max|v| max|q| scale.
__device__ void fixed_scales(const Problem& p, int dim_v, const float* amax, double& key_scale,
                             double& value_scale) {
  const double rows = double(p.n) * p.heads;
  value_scale = fixed_point_scale(rows * amax[1]);
  key_scale = fixed_point_scale(rows * 2.0 * dim_v * amax[1] * amax[2] * amax[0] * p.scale);
}

// What a thread knows of its two accumulator rows (ra, ra + 8 of the block's 64).
struct BwdRows {
  int ra, rb;
  int64_t row_a, row_b;
  float lse_a, lse_b;  // log2 units; +infinity (P = 0) outside the problem or for empty rows
  float d_a, d_b;
};

__device__ BwdRows bwd_rows(const Problem& p, const BwdArgs& g, int grp, int h0, int ra) {
  BwdRows r{};
  r.ra = ra;
  r.rb = ra + 8;
  r.row_a = tile_row(p, grp, h0, r.ra);
  r.row_b = tile_row(p, grp, h0, r.rb);
  auto lse2 = [&](int64_t row) {
    const float l = row >= 0 ? g.lse[row] : -INFINITY;
    return l == -INFINITY ? INFINITY : l * kLog2e;
  };
  r.lse_a = lse2(r.row_a);
  r.lse_b = lse2(r.row_b);
  r.d_a = r.row_a >= 0 ? g.delta[r.row_a] : 0.f;
  r.d_b = r.row_b >= 0 ? g.delta[r.row_b] : 0.f;
  return r;
}

// An m64nN accumulator of dq (n columns from col0) as bf16.
template <int D>
__device__ void store_dq_columns(const BwdArgs& g, const BwdRows& r, int lane, const float* acc,
                                 int n, int col0) {
  for (int i = 0; i < n / 2; i += 4) {
    const int col = col0 + 8 * (i / 4) + 2 * (lane % 4);
    store_pair(g.grad_q, r.row_a, D, col, acc[i], acc[i + 1]);
    store_pair(g.grad_q, r.row_b, D, col, acc[i + 2], acc[i + 3]);
  }
}
// Stores a warpgroup's dq accumulators as bf16: `blocks` 64-wide column blocks from first_block,
// n128 pairs in `pairs`, then one n64 block in `single` when `blocks` is odd.
template <int D, int kPairs>
__device__ void store_dq(const BwdArgs& g, const BwdRows& r, int lane,
                         const float (&pairs)[kPairs][64], const float (&single)[32],
                         int first_block, int blocks) {
#pragma unroll
  for (int c = 0; c < kPairs; ++c) {
    if (c < blocks / 2) store_dq_columns<D>(g, r, lane, pairs[c], 128, (first_block + 2 * c) * 64);
  }
  if (blocks % 2 == 1) store_dq_columns<D>(g, r, lane, single, 64, (first_block + blocks - 1) * 64);
}

// The dkey (key) or dvalue scale, for fixed_to_float_kernel.
struct DkvScaleOf {
  Problem p;
  int dim_v;
  const float* amax;
  bool key;
  __device__ double operator()() const {
    double key_scale, value_scale;
    fixed_scales(p, dim_v, amax, key_scale, value_scale);
    return key ? key_scale : value_scale;
  }
};

template <class Tr, int kMode, int D, int kCols4>
__device__ void add_key_grads(const float (&acc)[kCols4][4], const KeyList& list, int slot0,
                              int key_row, int col0, int lane, float* dst, unsigned long long* fx,
                              double fx_scale) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = list.key(slot0 + key_row + 8 * half);
    if (key < 0) continue;
#pragma unroll
    for (int nt = 0; nt < kCols4; ++nt) {
      const int64_t at = int64_t(key) * D + col0 + nt * 8 + 2 * (lane & 3);
      if constexpr (kMode == kDkvAtomic) {
        red_add_v2(dst + at, acc[nt][2 * half], acc[nt][2 * half + 1]);
      } else {
        fixed_add(fx + at, acc[nt][2 * half], fx_scale);
        fixed_add(fx + at + 1, acc[nt][2 * half + 1], fx_scale);
      }
    }
  }
}

// One warp's share of a key tile's gradient, added into the shared keys: rows (keys)
// 16 kg .. 16 kg + 15, columns cg * D/4 .., of A^T B with A the [64 rows x 32 keys] tile
// (P for dvalue, dS for dkey) and B the [64 rows x D] tile (dO, Q; in wgmma's layout when
// kWgmmaB).
template <class Tr, int kMode, int D, bool kWgmmaB = false>
__device__ void key_grad_tile(const bf16* a_tile, const bf16* b_tile, const KeyList& list,
                              int slot0, int kg, int cg, int lane, float* dst,
                              unsigned long long* fx, double fx_scale) {
  constexpr int kN = D / 4 / 8;
  float acc[kN][4] = {};
#pragma unroll
  for (int kk = 0; kk < 64; kk += 16) {
    uint32_t a[4];
    load_a_t<Tr::kBwdKeys>(a, a_tile, kk, kg * 16, lane);
#pragma unroll
    for (int nt = 0; nt < kN; nt += 2) {
      uint32_t b[4];
      if constexpr (kWgmmaB) {
        load_b_kn_wgmma_tile<64>(b, b_tile, kk, cg * (D / 4) + nt * 8, lane);
      } else {
        load_b_kn<D>(b, b_tile, kk, cg * (D / 4) + nt * 8, lane);
      }
      mma_bf16(acc[nt], a, b[0], b[1]);
      mma_bf16(acc[nt + 1], a, b[2], b[3]);
    }
  }
  add_key_grads<Tr, kMode, D, kN>(acc, list, slot0, kg * 16 + (lane >> 2), cg * (D / 4), lane, dst,
                                  fx, fx_scale);
}

template <class Tr, int kMode>
__global__ void __launch_bounds__(Tr::kThreads, 1) sparse_attn_bwd_kernel(Problem p, BwdArgs g) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kBwdKeys, T = Tr::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdo = sq + 64 * DQ;
  bf16* sk = sdo + 64 * DV;
  bf16* sv = sk + BK * DQ;
  bf16* sp = sv + BK * DV;
  bf16* sds = sp + 64 * BK;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, rw = warp & 3, cw = warp >> 2;
  const auto [grp, h0] = block_tile(p);
  const KeyList list = key_list(p, grp);
  load_tile_rows<DQ, T>(sq, p.q, p, grp, h0, tid);
  load_tile_rows<DV, T>(sdo, g.grad_out, p, grp, h0, tid);

  const auto [ra, rb, row_a, row_b, lse_a, lse_b, d_a, d_b] =
      bwd_rows(p, g, grp, h0, rw * 16 + (lane >> 2));
  const int ga = ra / p.hb, gb = rb / p.hb;

  constexpr int kQTiles = kMode == kDq ? DQ / 2 / 8 : 1;
  float dq[kQTiles][4];
#pragma unroll
  for (int i = 0; i < kQTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
  double key_scale = 1, value_scale = 1;
  if constexpr (kMode == kDkvFixed) fixed_scales(p, DV, g.amax, key_scale, value_scale);

  const int tiles = static_cast<int>(ceil_div(list.count, BK));
  for (int j = 0; j < tiles; ++j) {
    gather_keys<DQ, BK, T>(sk, p.key, list, j * BK, tid);
    gather_keys<DV, BK, T>(sv, p.value, list, j * BK, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[2][4] = {}, dp[2][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < DQ; k0 += 16) {
      uint32_t a[4], b[4];
      load_a<DQ>(a, sq, rw * 16, k0, lane);
      load_b_nk<DQ>(b, sk, cw * 16, k0, lane);
      mma_bf16(s[0], a, b[0], b[1]);
      mma_bf16(s[1], a, b[2], b[3]);
    }
#pragma unroll 4
    for (int k0 = 0; k0 < DV; k0 += 16) {
      uint32_t a[4], b[4];
      load_a<DV>(a, sdo, rw * 16, k0, lane);
      load_b_nk<DV>(b, sv, cw * 16, k0, lane);
      mma_bf16(dp[0], a, b[0], b[1]);
      mma_bf16(dp[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float pr[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = j * BK + cw * 16 + nt * 8 + 2 * (lane & 3) + (e & 1);
        const bool lo = e < 2;
        const bool seen = list.sees(slot, lo ? ga : gb);
        pr[e] = seen ? exp2f(s[nt][e] * p.scale_log2 - (lo ? lse_a : lse_b)) : 0.f;
        ds[e] = pr[e] * (dp[nt][e] - (lo ? d_a : d_b)) * p.scale;
      }
      const int col = cw * 16 + nt * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(sp + swz<BK>(ra, col)) = pack_bf16(pr[0], pr[1]);
      *reinterpret_cast<uint32_t*>(sp + swz<BK>(rb, col)) = pack_bf16(pr[2], pr[3]);
      *reinterpret_cast<uint32_t*>(sds + swz<BK>(ra, col)) = pack_bf16(ds[0], ds[1]);
      *reinterpret_cast<uint32_t*>(sds + swz<BK>(rb, col)) = pack_bf16(ds[2], ds[3]);
    }
    __syncthreads();
    if constexpr (kMode == kDq) {
      mma_rows_by_kn<BK, DQ>(dq, sds, rw * 16, sk, cw * (DQ / 2), lane);
    } else {
      const int kg = warp & 1, cg = warp >> 1;
      key_grad_tile<Tr, kMode, DV>(sp, sdo, list, j * BK, kg, cg, lane, g.grad_value, g.fixed_value,
                                   value_scale);
      key_grad_tile<Tr, kMode, DQ>(sds, sq, list, j * BK, kg, cg, lane, g.grad_key, g.fixed_key,
                                   key_scale);
    }
    __syncthreads();
  }
  if constexpr (kMode == kDq) {
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
      const int col = cw * (DQ / 2) + nt * 8 + 2 * (lane & 3);
      store_pair(g.grad_q, row_a, DQ, col, dq[nt][0], dq[nt][1]);
      store_pair(g.grad_q, row_b, DQ, col, dq[nt][2], dq[nt][3]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward on wgmma (SparseAttnWgmmaTraits), for the blocks the wgmma forward takes. Both kernels
// share the front half of a 32-key tile: warpgroup 0 computes S = Q K^T and P while warpgroup 1
// computes dP = dO V^T; P crosses in shared memory (fp32) and warpgroup 1 forms
// dS = scale P (dP - D). Q and dO stay in shared memory for the whole block.

// The shared memory of a backward block, tiles in wgmma's layout: Q, dO, the K and V tiles,
// then the kernel's own P / dS tiles and the P exchange.
template <class Tr>
struct BwdTiles {
  bf16 *q, *grad_out, *key, *value;
  float* p_exchange;  // [BK / 2][128]
  bf16* zeros;        // 4 KB
  unsigned char* rest;
  __device__ explicit BwdTiles(unsigned char* base) {
    q = reinterpret_cast<bf16*>(base);
    grad_out = q + 64 * Tr::kDimQk;
    key = grad_out + 64 * Tr::kDimV;
    value = key + Tr::kBwdKeys * Tr::kDimQk;
    p_exchange = reinterpret_cast<float*>(value + Tr::kBwdKeys * Tr::kDimV);
    zeros = reinterpret_cast<bf16*>(p_exchange + Tr::kBwdKeys / 2 * 128);
    rest = reinterpret_cast<unsigned char*>(zeros + 2048);
  }
};

// Starts the block's loads: Q and dO rows, and the first K and V tiles (one commit group).
template <class Tr>
__device__ void start_bwd_block(const Problem& p, const BwdArgs& g, const BwdTiles<Tr>& t,
                                const KeyList& list, int grp, int h0, int tid) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kBwdKeys, T = Tr::kThreads;
  load_block_rows<DQ, T>(t.q, p.q, p, grp, h0, tid);
  load_block_rows<DV, T>(t.grad_out, g.grad_out, p, grp, h0, tid);
  gather_rows_wgmma<DQ, BK, T>(t.key, p.key, list, 0, tid);
  gather_rows_wgmma<DV, BK, T>(t.value, p.value, list, 0, tid);
  cp_async_commit();
  static_assert(T * 16 == 4096, "one 16-byte store per thread clears the zero tile");
  reinterpret_cast<uint4*>(t.zeros)[tid] = make_uint4(0, 0, 0, 0);
}

// The front half of tile j (K(j), V(j) landed and visible): on return warpgroup 1 holds P and dS
// at its accumulator positions (n8 tile i / 4, row ra for i % 4 < 2, else rb). Has one block
// barrier, after which K(j) and V(j) are no longer read by it.
template <class Tr>
__device__ void tile_p_and_ds(const Problem& p, const KeyList& list, int j, const BwdTiles<Tr>& t,
                              const BwdRows& r, int wg, int tid, int lane,
                              float (&prob)[Tr::kBwdKeys / 2], float (&ds)[Tr::kBwdKeys / 2]) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kBwdKeys;
  // One instruction stream for both warpgroups (wgmma under divergent branches is serialized):
  // the shorter product runs its surplus k-steps against the zero tile.
  constexpr int kSteps = (DQ > DV ? DQ : DV) / 16;
  const bf16* a_tile = wg == 0 ? t.q : t.grad_out;
  const bf16* b_tile = wg == 0 ? t.key : t.value;
  const int steps = wg == 0 ? DQ / 16 : DV / 16;
  float acc[BK / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    const bool real = ks < steps;
    const uint64_t b =
        real ? matrix_descriptor<BK>(b_tile, 0, ks) : matrix_descriptor<BK>(t.zeros, 0, 0);
    Wgmma<BK>::run(acc, matrix_descriptor<64>(a_tile, 0, real ? ks : 0), b, ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (wg == 0) {
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) {
      const int slot = j * BK + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
      const float lse = i % 4 < 2 ? r.lse_a : r.lse_b;
      t.p_exchange[i * 128 + tid] = list.sees(slot, 0) ? exp2f(acc[i] * p.scale_log2 - lse) : 0.f;
    }
  }
  __syncthreads();
  if (wg == 1) {
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) {
      prob[i] = t.p_exchange[i * 128 + tid - 128];
      ds[i] = prob[i] * (acc[i] - (i % 4 < 2 ? r.d_a : r.d_b)) * p.scale;
    }
  }
}

// dq: after the front half, both warpgroups add dS K (K read MN-major) into their blocks of dq's
// columns, kept in registers.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_bwd_dq_wgmma_kernel(Problem p, BwdArgs g) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kBwdKeys, T = Tr::kThreads;
  constexpr int kPairs = Tr::kDqPairs;
  extern __shared__ __align__(1024) unsigned char dq_raw[];
  const BwdTiles<Tr> t(dq_raw);
  bf16* sds = reinterpret_cast<bf16*>(t.rest);  // [64 rows x 64] (keys 0..31 used)

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const auto [grp, h0] = block_tile(p);
  const KeyList list = key_list(p, grp);
  start_bwd_block<Tr>(p, g, t, list, grp, h0, tid);
  const BwdRows r = bwd_rows(p, g, grp, h0, warp * 16 + lane / 4);

  // This warpgroup's 64-wide column blocks of dq: n128 pairs, then one n64 single if odd.
  const int first_block = wg == 0 ? 0 : Tr::kDqFirstBlocks;
  const int blocks = wg == 0 ? Tr::kDqFirstBlocks : Tr::kDqBlocks - Tr::kDqFirstBlocks;
  const int pairs = blocks / 2;
  const bool single = blocks % 2 == 1;
  float dq_pair[kPairs > 0 ? kPairs : 1][64];
  float dq_single[32];
#pragma unroll
  for (int c = 0; c < (kPairs > 0 ? kPairs : 1); ++c) {
#pragma unroll
    for (int i = 0; i < 64; ++i) dq_pair[c][i] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) dq_single[i] = 0.f;

  const int tiles = static_cast<int>(ceil_div(list.count, BK));
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<0>();  // K(j) and V(j) (and, first, Q and dO) have landed
    fence_async_shared();
    __syncthreads();
    float prob[BK / 2], ds[BK / 2];
    tile_p_and_ds<Tr>(p, list, j, t, r, wg, tid, lane, prob, ds);
    if (j + 1 < tiles) gather_rows_wgmma<DV, BK, T>(t.value, p.value, list, (j + 1) * BK, tid);
    if (wg == 1) {
#pragma unroll
      for (int i = 0; i < BK / 2; i += 4) {
        const int col = 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(sds + swizzled_offset<64>(r.ra, col / 8) + col % 8) =
            pack_bf16(ds[i], ds[i + 1]);
        *reinterpret_cast<uint32_t*>(sds + swizzled_offset<64>(r.rb, col / 8) + col % 8) =
            pack_bf16(ds[i + 2], ds[i + 3]);
      }
      fence_async_shared();  // dS is read by wgmma
    }
    __syncthreads();
    // dq (+)= dS K over this warpgroup's column blocks.
#pragma unroll
    for (int c = 0; c < (kPairs > 0 ? kPairs : 1); ++c) fence_accumulators(dq_pair[c]);
    fence_accumulators(dq_single);
    wgmma_fence();
    // Both warpgroups issue kPairs pairs and (if either has one) a single; those a warpgroup
    // lacks read the zero tile (as 16-row column blocks) and are never stored.
    const uint64_t zero = mn_major_descriptor<16>(t.zeros, 0, 0);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      const uint64_t a = matrix_descriptor<64>(sds, 0, ks);
#pragma unroll
      for (int c = 0; c < kPairs; ++c) {
        Wgmma<128, 1>::run(
            dq_pair[c], a,
            c < pairs ? mn_major_descriptor<BK>(t.key, (first_block + 2 * c) * 64, ks * 16) : zero,
            1);
      }
      if constexpr (Tr::kDqSingle) {
        Wgmma<64, 1>::run(
            dq_single, a,
            single ? mn_major_descriptor<BK>(t.key, (first_block + 2 * pairs) * 64, ks * 16) : zero,
            1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < (kPairs > 0 ? kPairs : 1); ++c) fence_accumulators(dq_pair[c]);
    fence_accumulators(dq_single);
    __syncthreads();  // K(j) and dS are no longer read
    if (j + 1 < tiles) gather_rows_wgmma<DQ, BK, T>(t.key, p.key, list, (j + 1) * BK, tid);
    cp_async_commit();
  }
  cp_async_wait<0>();
  store_dq<DQ>(g, r, lane, dq_pair, dq_single, first_block, blocks);
}

// dkey and dvalue: after the front half, warpgroup 1 writes P and dS (bf16) to shared memory and
// the next K and V tiles start loading (these products read neither); then all eight warps form
// the tile's P^T dO and dS^T Q on mma.sync (as the mma.sync kernel does) and add them into the
// shared keys: fp32 atomics (kDkvAtomic) or 64-bit fixed point (kDkvFixed).
template <class Tr, int kMode>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_bwd_dkv_wgmma_kernel(Problem p, BwdArgs g) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kBwdKeys, T = Tr::kThreads;
  using MmaTr = SparseAttnTraits<DQ, DV>;
  static_assert(MmaTr::kBwdKeys == BK, "the mma.sync products take the same key tiles");
  extern __shared__ __align__(1024) unsigned char dkv_raw[];
  const BwdTiles<Tr> t(dkv_raw);
  bf16* sp = reinterpret_cast<bf16*>(t.rest);  // [64 rows x 32 keys], the mma.sync layout
  bf16* sds = sp + 64 * BK;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const auto [grp, h0] = block_tile(p);
  const KeyList list = key_list(p, grp);
  start_bwd_block<Tr>(p, g, t, list, grp, h0, tid);
  const BwdRows r = bwd_rows(p, g, grp, h0, warp * 16 + lane / 4);
  double key_scale = 1, value_scale = 1;
  if constexpr (kMode == kDkvFixed) fixed_scales(p, DV, g.amax, key_scale, value_scale);
  const int kg = (tid / 32) & 1, cg = tid / 64;  // the mma.sync warps' key half, column quarter

  const int tiles = static_cast<int>(ceil_div(list.count, BK));
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<0>();  // K(j) and V(j) (and, first, Q and dO) have landed
    fence_async_shared();
    __syncthreads();  // and the previous tile's P and dS are no longer read
    float prob[BK / 2], ds[BK / 2];
    tile_p_and_ds<Tr>(p, list, j, t, r, wg, tid, lane, prob, ds);
    if (j + 1 < tiles) {
      gather_rows_wgmma<DQ, BK, T>(t.key, p.key, list, (j + 1) * BK, tid);
      gather_rows_wgmma<DV, BK, T>(t.value, p.value, list, (j + 1) * BK, tid);
    }
    cp_async_commit();
    if (wg == 1) {
#pragma unroll
      for (int i = 0; i < BK / 2; i += 4) {
        const int col = 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(sp + swz<BK>(r.ra, col)) = pack_bf16(prob[i], prob[i + 1]);
        *reinterpret_cast<uint32_t*>(sp + swz<BK>(r.rb, col)) = pack_bf16(prob[i + 2], prob[i + 3]);
        *reinterpret_cast<uint32_t*>(sds + swz<BK>(r.ra, col)) = pack_bf16(ds[i], ds[i + 1]);
        *reinterpret_cast<uint32_t*>(sds + swz<BK>(r.rb, col)) = pack_bf16(ds[i + 2], ds[i + 3]);
      }
    }
    __syncthreads();
    key_grad_tile<MmaTr, kMode, DV, true>(sp, t.grad_out, list, j * BK, kg, cg, lane, g.grad_value,
                                          g.fixed_value, value_scale);
    key_grad_tile<MmaTr, kMode, DQ, true>(sds, t.q, list, j * BK, kg, cg, lane, g.grad_key,
                                          g.fixed_key, key_scale);
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Backward with values inside the keys (SparseAttnLatentBwdTraits): dq and the key rows' gradient
// in one kernel, S and dP computed once a tile.

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

// Tile j's S and dP for warpgroup wg's half of the keys, then its P and dS into their tiles: the
// k-steps over K(j)'s early blocks (landed and visible), then, once late_blocks_landed() has
// made the late ones visible, the rest. Both products read their A operand (Q, dO) whole, so the
// halves together read it twice; in exchange P stays fp32 for dS and no warpgroup waits for the
// other here.
template <class Tr, class LateBlocksLanded>
__device__ void latent_bwd_scores(const Problem& p, int j, const LatentBwdTiles<Tr>& t,
                                  const BwdRows& r, int wg, int lane,
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
    }
    const int at = swizzled_offset<64>(lower ? r.ra : r.rb, col / 8) + col % 8;
    *reinterpret_cast<uint32_t*>(t.prob + at) = pack_bf16(prob[0], prob[1]);
    *reinterpret_cast<uint32_t*>(t.grad_score + at) = pack_bf16(ds[0], ds[1]);
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
    // Query grp starts about grp / resident_queries item times after query 0, so by then query 0
    // has advanced grp * tiles / resident_queries tiles; mod tiles, that is the formula below.
    first_slot =
        resident_queries > 0 ? grp % resident_queries * tiles() / resident_queries * kKeys : 0;
  }
  __device__ int tiles() const { return static_cast<int>(ceil_div(list.count, kKeys)); }
  __device__ int key(int slot) const {
    const int span = tiles() * kKeys;
    if (slot >= span) return -1;
    const int at = slot + first_slot;
    return list.key(at >= span ? at - span : at);
  }
};

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

template <class Tr, bool kPaired>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_bwd_latent_kernel(Problem p, BwdArgs g) {
  constexpr int DQ = Tr::kDimQk, DV = Tr::kDimV, BK = Tr::kKeys, T = Tr::kThreads;
  extern __shared__ __align__(1024) unsigned char latent_bwd_raw[];
  const LatentBwdTiles<Tr> t(latent_bwd_raw);
  const int tid = threadIdx.x, wg = warpgroup_index(), warp = (tid % 128) / 32, lane = tid % 32;
  const auto [grp, h0] = block_tile(p);
  const RotatedKeys<BK> list(key_list(p, grp), grp, g.resident_queries);
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
    latent_bwd_scores<Tr>(p, j, t, r, wg, lane, [&] {
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

// D[row] = sum_c dO[row, c] * O[row, c] (fp32), one warp per row.
__global__ void row_dot_kernel(const bf16* a, const bf16* b, int64_t rows, int dim, float* out) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float sum = 0.f;
  for (int c = lane; c < dim; c += 32) {
    sum += __bfloat162float(a[row * dim + c]) * __bfloat162float(b[row * dim + c]);
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
  if (lane == 0) out[row] = sum;
}

// ---------------------------------------------------------------------------------------------
// G = 1: each query's slots up to and including its last valid one, so that the kernels skip the
// -1 slots after it instead of masking them (a causal query t < k has k - t - 1 of them, its
// last). A warp a query reads its slots from the end, 32 at a time: most stop at the first read.
constexpr int kSlotCountThreads = 256;

__global__ void __launch_bounds__(kSlotCountThreads)
    slot_count_kernel(const int32_t* indices, int n, int topk, int32_t* count) {
  const int64_t query = (int64_t(blockIdx.x) * kSlotCountThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (query >= n) return;
  const int32_t* slots = indices + query * topk;
  for (int end = topk; end > 0; end -= 32) {
    const int slot = end - 32 + lane;
    const unsigned valid = __ballot_sync(0xffffffffu, slot >= 0 && slots[slot] >= 0);
    if (valid != 0) {
      if (lane == 0) count[query] = end - __clz(valid);  // the highest valid slot + 1
      return;
    }
  }
  if (lane == 0) count[query] = 0;
}

// Key union of each group of G queries: the G * topk slots, packed as key << 4 | g, are sorted
// in shared memory (bitonic), then equal keys merge into one entry whose mask ORs their g bits.
constexpr int kUnionThreads = 1024;

__global__ void __launch_bounds__(kUnionThreads)
    build_union_kernel(const int32_t* indices, int n, int topk, int group, int pow2, int32_t* ukeys,
                       uint16_t* umask, int32_t* ucount, int64_t cap) {
  extern __shared__ uint32_t buf[];
  __shared__ int warp_sums[kUnionThreads / 32];
  const int grp = blockIdx.x, tid = threadIdx.x, total = group * topk;
  for (int i = tid; i < pow2; i += kUnionThreads) {
    uint32_t v = 0xffffffffu;
    if (i < total) {
      const int g = i / topk;
      const int64_t query = int64_t(grp) * group + g;
      const int key = query < n ? indices[query * topk + i % topk] : -1;
      if (key >= 0) v = (uint32_t(key) << 4) | uint32_t(g);
    }
    buf[i] = v;
  }
  __syncthreads();
  for (int k = 2; k <= pow2; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < pow2; i += kUnionThreads) {
        const int other = i ^ j;
        if (other > i) {
          const uint32_t a = buf[i], b = buf[other];
          if ((a > b) == ((i & k) == 0)) {
            buf[i] = b;
            buf[other] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  // Each thread owns a contiguous run of slots; count first occurrences, scan, write.
  const int per = (pow2 + kUnionThreads - 1) / kUnionThreads;
  const int lo = min(pow2, tid * per), hi = min(pow2, lo + per);
  auto first = [&](int i) {
    return buf[i] != 0xffffffffu && (i == 0 || (buf[i] >> 4) != (buf[i - 1] >> 4));
  };
  int mine = 0;
  for (int i = lo; i < hi; ++i) mine += first(i);
  int incl = mine;
  const int lane = tid & 31, warp = tid >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffff, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffff, w, o);
      if (lane >= o) w += x;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  int pos = incl - mine + (warp > 0 ? warp_sums[warp - 1] : 0);
  for (int i = lo; i < hi; ++i) {
    if (!first(i)) continue;
    const uint32_t key = buf[i] >> 4;
    uint32_t bits = 0;
    for (int r = i; r < pow2 && (buf[r] >> 4) == key && buf[r] != 0xffffffffu; ++r) {
      bits |= 1u << (buf[r] & 15);
    }
    ukeys[grp * cap + pos] = int32_t(key);
    umask[grp * cap + pos] = uint16_t(bits);
    ++pos;
  }
  if (tid == kUnionThreads - 1) ucount[grp] = warp_sums[31];
}

// ---------------------------------------------------------------------------------------------
// Host side.

int next_pow2(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

struct UnionPlan {
  int32_t* keys = nullptr;
  uint16_t* mask = nullptr;
  int32_t* count = nullptr;
  int64_t cap = 0;
};

int64_t groups_of(const SparseAttnShape& s, int64_t group) {
  return ceil_div(s.num_queries, group);
}

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

size_t plan_bytes(const SparseAttnShape& s, int64_t group) {
  if (group == 1) return align256(s.num_queries * 4);
  const int64_t slots = groups_of(s, group) * group * s.topk;
  return align256(slots * 4) + align256(slots * 2) + align256(groups_of(s, group) * 4);
}

// Carves the plan out of `workspace`; returns the bytes used.
size_t build_plan(const SparseAttnShape& s, const int32_t* indices, int64_t group, void* workspace,
                  UnionPlan& plan, cudaStream_t stream) {
  if (group == 1) {
    plan.count = static_cast<int32_t*>(workspace);
    const int64_t threads = s.num_queries * 32;
    slot_count_kernel<<<static_cast<unsigned>(ceil_div(threads, kSlotCountThreads)),
                        kSlotCountThreads, 0, stream>>>(indices, static_cast<int>(s.num_queries),
                                                        static_cast<int>(s.topk), plan.count);
    check(cudaGetLastError(), "slot_count_kernel");
    return plan_bytes(s, group);
  }
  const int64_t groups = groups_of(s, group);
  plan.cap = group * s.topk;
  auto* base = static_cast<unsigned char*>(workspace);
  plan.keys = reinterpret_cast<int32_t*>(base);
  plan.mask = reinterpret_cast<uint16_t*>(base + align256(groups * plan.cap * 4));
  plan.count = reinterpret_cast<int32_t*>(base + align256(groups * plan.cap * 4) +
                                          align256(groups * plan.cap * 2));
  const int pow2 = next_pow2(static_cast<int>(plan.cap));
  const size_t smem = size_t(pow2) * 4;
  check(cudaFuncSetAttribute(build_union_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "union smem");
  build_union_kernel<<<static_cast<unsigned>(groups), kUnionThreads, smem, stream>>>(
      indices, static_cast<int>(s.num_queries), static_cast<int>(s.topk), static_cast<int>(group),
      pow2, plan.keys, plan.mask, plan.count, plan.cap);
  check(cudaGetLastError(), "build_union_kernel");
  return plan_bytes(s, group);
}

Problem make_problem(const SparseAttnShape& s, const void* q, const void* key, const void* value,
                     const int32_t* indices, float scale, int64_t group, const UnionPlan& plan) {
  Problem p{};
  p.q = static_cast<const bf16*>(q);
  p.key = static_cast<const bf16*>(key);
  p.value = static_cast<const bf16*>(value);
  p.indices = indices;
  p.ukeys = plan.keys;
  p.umask = plan.mask;
  p.ucount = plan.count;
  p.cap = plan.cap;
  p.n = static_cast<int>(s.num_queries);
  p.heads = static_cast<int>(s.heads);
  p.topk = static_cast<int>(s.topk);
  p.group = static_cast<int>(group);
  p.hb = static_cast<int>(std::min<int64_t>(s.heads, 64 / group));
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  return p;
}

dim3 grid_of(const SparseAttnShape& s, const Problem& p) {
  const int64_t blocks = groups_of(s, p.group) * ceil_div(s.heads, p.hb);
  if (blocks > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("hyscale::sparse_attn (CUDA): num_queries * heads is too large");
  }
  return dim3(static_cast<unsigned>(blocks));
}

// How many blocks of `kernel` the device holds at once: a persistent kernel's grid.
template <class Kernel>
unsigned resident_blocks(Kernel kernel, int threads, int smem) {
  int device = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&device), "device");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), "occupancy");
  return static_cast<unsigned>(std::max(1, sms * per_sm));
}

template <class Fn>
void dispatch_dims(int64_t dim_qk, int64_t dim_v, Fn&& fn) {
#define HYSCALE_SA_CASE(DQ, DV)      \
  if (dim_qk == DQ && dim_v == DV) { \
    fn(SparseAttnTraits<DQ, DV>{});  \
    return;                          \
  }
  HYSCALE_SPARSE_ATTN_DIMS(HYSCALE_SA_CASE)
#undef HYSCALE_SA_CASE
  throw std::invalid_argument("hyscale::sparse_attn (CUDA): unsupported d_qk = " +
                              std::to_string(dim_qk) + ", d_v = " + std::to_string(dim_v));
}

void check_call(const SparseAttnShape& s, int64_t group) {
  s.validate();
  if (!cuda_sparse_attn_dims_supported(s.dim_qk, s.dim_v)) {
    throw std::invalid_argument(std::string("hyscale::sparse_attn (CUDA): the kernels take ") +
                                kCudaSparseAttnDims + "; got (" + std::to_string(s.dim_qk) + ", " +
                                std::to_string(s.dim_v) + ")");
  }
  if (!sparse_attn_group_supported(group, s.topk)) {
    throw std::invalid_argument(
        "hyscale::sparse_attn (CUDA): group must be 1, 2, 4, 8 or 16 with group * topk <= " +
        std::to_string(kMaxGroupSlots) + "; got group = " + std::to_string(group) +
        ", topk = " + std::to_string(s.topk));
  }
  if (s.num_keys >= (int64_t(1) << 27) || s.num_queries * s.heads >= (int64_t(1) << 31)) {
    throw std::invalid_argument("hyscale::sparse_attn (CUDA): M must be < 2^27 and N * H < 2^31");
  }
}

// Whether a kernel family's traits take the shape's (d_qk, d_v).
template <template <int, int> class Traits>
bool traits_support(const SparseAttnShape& s) {
  if (!cuda_sparse_attn_dims_supported(s.dim_qk, s.dim_v)) return false;
  bool supported = false;
  dispatch_dims(s.dim_qk, s.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    supported = Traits<Tr::kDimQk, Tr::kDimV>::kSupported;
  });
  return supported;
}

// Whether the forward and the backward run on the wgmma kernels: whole 64-head tiles of one query.
bool wgmma_tiles(const SparseAttnShape& s, int64_t group) {
  return traits_support<SparseAttnWgmmaTraits>(s) && group == 1 && s.heads % 64 == 0;
}

}  // namespace

bool sparse_attn_group_supported(int64_t group, int64_t topk) {
  const bool pow2 = group == 1 || group == 2 || group == 4 || group == 8 || group == 16;
  return pow2 && (group == 1 || group * topk <= kMaxGroupSlots);
}

int64_t sparse_attn_default_group(int64_t heads, int64_t topk) {
  int64_t g = 1;
  while (g * 2 <= kMaxGroup && g * 2 * heads <= 64 && sparse_attn_group_supported(g * 2, topk)) {
    g *= 2;
  }
  return g;
}

size_t sparse_attn_fwd_workspace_bytes(const SparseAttnShape& shape, int64_t group) {
  return plan_bytes(shape, group);
}

bool sparse_attn_fwd_reads_values_from_keys(const SparseAttnShape& shape, int64_t group) {
  return wgmma_tiles(shape, group) && traits_support<SparseAttnLatentTraits>(shape);
}

void sparse_attn_fwd(const SparseAttnShape& shape, const void* q, const void* key,
                     const void* value, const int32_t* indices, float scale, int64_t group,
                     void* out, float* lse, void* workspace, Stream stream_) {
  check_call(shape, group);
  const bool value_in_key = value == key;
  if (value_in_key && !sparse_attn_fwd_reads_values_from_keys(shape, group)) {
    throw std::invalid_argument(
        "hyscale::sparse_attn (CUDA): value == key (values as the first d_v columns of the key "
        "rows) needs G = 1, H a multiple of 64, d_v <= d_qk and d_v a multiple of 128");
  }
  if (shape.num_queries == 0 || shape.heads == 0) return;
  auto stream = static_cast<cudaStream_t>(stream_);
  UnionPlan plan;
  build_plan(shape, indices, group, workspace, plan, stream);
  const Problem p = make_problem(shape, q, key, value, indices, scale, group, plan);
  const FwdOut result{static_cast<bf16*>(out), lse};
  dispatch_dims(shape.dim_qk, shape.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    using Wg = SparseAttnWgmmaTraits<Tr::kDimQk, Tr::kDimV>;
    if constexpr (Wg::kSupported) {
      if (wgmma_tiles(shape, group)) {
        auto launch = [&](auto kernel, int threads, int smem, bool persistent) {
          check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                "forward smem");
          dim3 grid = grid_of(shape, p);
          if (persistent) grid.x = std::min(grid.x, resident_blocks(kernel, threads, smem));
          kernel<<<grid, threads, smem, stream>>>(p, result);
          check(cudaGetLastError(), "sparse_attn forward kernel");
        };
        using Latent = SparseAttnLatentTraits<Tr::kDimQk, Tr::kDimV>;
        if constexpr (Latent::kSupported) {
          if (value_in_key) {
            launch(sparse_attn_fwd_latent_kernel<Latent>, Latent::kThreads, Latent::kSmemBytes,
                   true);
            return;
          }
        }
        launch(sparse_attn_fwd_wgmma_kernel<Wg>, Wg::kThreads, Wg::kFwdSmemBytes, false);
        return;
      }
    }
    const size_t smem = size_t(Tr::kFwdSmemElems) * sizeof(bf16);
    check(cudaFuncSetAttribute(sparse_attn_fwd_kernel<Tr>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "forward smem");
    sparse_attn_fwd_kernel<Tr><<<grid_of(shape, p), Tr::kThreads, smem, stream>>>(p, result);
    check(cudaGetLastError(), "sparse_attn_fwd_kernel");
  });
}

size_t sparse_attn_bwd_workspace_bytes(const SparseAttnShape& s, int64_t group,
                                       bool deterministic) {
  size_t bytes = plan_bytes(s, group) + align256(s.num_queries * s.heads * 4) + 256;
  if (deterministic) bytes += align256(s.num_keys * (s.dim_qk + s.dim_v) * 8);
  return bytes;
}

// D = rowsum(dO * O) of every (query, head) row into `workspace` (N H floats).
float* row_deltas(const SparseAttnShape& s, const void* out, const void* grad_out, void* workspace,
                  cudaStream_t stream) {
  const int64_t rows = s.num_queries * s.heads;
  auto* delta = static_cast<float*>(workspace);
  row_dot_kernel<<<static_cast<unsigned>(ceil_div(rows * 32, 256)), 256, 0, stream>>>(
      static_cast<const bf16*>(grad_out), static_cast<const bf16*>(out), rows,
      static_cast<int>(s.dim_v), delta);
  check(cudaGetLastError(), "row_dot_kernel");
  return delta;
}

void sparse_attn_bwd(const SparseAttnShape& shape, const void* q, const void* key,
                     const void* value, const int32_t* indices, float scale, const void* out,
                     const float* lse, const void* grad_out, int64_t group, bool deterministic,
                     void* grad_q, float* grad_key, float* grad_value, void* workspace,
                     Stream stream_) {
  check_call(shape, group);
  auto stream = static_cast<cudaStream_t>(stream_);
  const int64_t key_elems = shape.num_keys * shape.dim_qk,
                value_elems = shape.num_keys * shape.dim_v;
  check(cudaMemsetAsync(grad_key, 0, key_elems * 4, stream), "memset");
  check(cudaMemsetAsync(grad_value, 0, value_elems * 4, stream), "memset");
  if (shape.num_queries == 0 || shape.heads == 0) return;
  UnionPlan plan;
  auto* base = static_cast<unsigned char*>(workspace);
  base += build_plan(shape, indices, group, base, plan, stream);
  const int64_t rows = shape.num_queries * shape.heads;
  BwdArgs g{};
  g.grad_out = static_cast<const bf16*>(grad_out);
  g.lse = lse;
  g.grad_q = static_cast<bf16*>(grad_q);
  g.grad_key = grad_key;
  g.grad_value = grad_value;
  g.delta = row_deltas(shape, out, grad_out, base, stream);
  base += align256(rows * 4);
  auto* amax = reinterpret_cast<float*>(base);
  g.amax = amax;
  base += 256;
  if (deterministic) {
    g.fixed_key = reinterpret_cast<unsigned long long*>(base);
    g.fixed_value = g.fixed_key + key_elems;
    check(cudaMemsetAsync(g.fixed_key, 0, (key_elems + value_elems) * 8, stream), "memset");
    check(cudaMemsetAsync(amax, 0, 3 * sizeof(float), stream), "memset");
    const void* srcs[3] = {q, grad_out, value};
    const int64_t counts[3] = {rows * shape.dim_qk, rows * shape.dim_v, value_elems};
    for (int i = 0; i < 3; ++i) {
      absmax_kernel<<<264, 256, 0, stream>>>(static_cast<const bf16*>(srcs[i]), counts[i],
                                             amax + i);
      check(cudaGetLastError(), "absmax_kernel");
    }
  }
  const Problem p = make_problem(shape, q, key, value, indices, scale, group, plan);
  dispatch_dims(shape.dim_qk, shape.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    using Wg = SparseAttnWgmmaTraits<Tr::kDimQk, Tr::kDimV>;
    static_assert(Wg::kThreads == Tr::kThreads, "one launch shape for both kernel families");
    auto launch = [&](auto kernel, int smem) {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            "backward smem");
      kernel<<<grid_of(shape, p), Tr::kThreads, smem, stream>>>(p, g);
      check(cudaGetLastError(), "sparse_attn backward kernel");
    };
    // wgmma kernels for whole 64-head tiles of one query, the mma.sync ones otherwise.
    bool launched = false;
    if constexpr (Wg::kSupported) {
      if (wgmma_tiles(shape, group)) {
        launch(sparse_attn_bwd_dq_wgmma_kernel<Wg>, Wg::kBwdSmemBytes);
        if (deterministic) {
          launch(sparse_attn_bwd_dkv_wgmma_kernel<Wg, kDkvFixed>, Wg::kBwdSmemBytes);
        } else {
          launch(sparse_attn_bwd_dkv_wgmma_kernel<Wg, kDkvAtomic>, Wg::kBwdSmemBytes);
        }
        launched = true;
      }
    }
    if (!launched) {
      const int smem = int(Tr::kBwdSmemElems * sizeof(bf16));
      launch(sparse_attn_bwd_kernel<Tr, kDq>, smem);
      if (deterministic) {
        launch(sparse_attn_bwd_kernel<Tr, kDkvFixed>, smem);
      } else {
        launch(sparse_attn_bwd_kernel<Tr, kDkvAtomic>, smem);
      }
    }
    if (deterministic) {
      for (const bool is_key : {true, false}) {
        fixed_to_float_kernel<<<1024, 256, 0, stream>>>(
            is_key ? g.fixed_key : g.fixed_value, is_key ? key_elems : value_elems,
            DkvScaleOf{p, int(shape.dim_v), amax, is_key}, is_key ? grad_key : grad_value);
        check(cudaGetLastError(), "fixed_to_float_kernel");
      }
    }
  });
}

bool sparse_attn_bwd_latent_supported(const SparseAttnShape& shape, int64_t group,
                                      bool deterministic) {
  return !deterministic && wgmma_tiles(shape, group) &&
         traits_support<SparseAttnLatentBwdTraits>(shape);
}

size_t sparse_attn_bwd_latent_workspace_bytes(const SparseAttnShape& shape) {
  return plan_bytes(shape, 1) + align256(shape.num_queries * shape.heads * 4);
}

void sparse_attn_bwd_latent(const SparseAttnShape& shape, const void* q, const void* kv,
                            const int32_t* indices, float scale, const void* out, const float* lse,
                            const void* grad_out, void* grad_q, float* grad_kv, void* workspace,
                            Stream stream_) {
  check_call(shape, 1);
  if (!sparse_attn_bwd_latent_supported(shape, 1, false)) {
    throw std::invalid_argument(
        "hyscale::sparse_attn (CUDA): the latent backward needs G = 1, H a multiple of 64, d_v <= "
        "d_qk and d_qk >= 192");
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  check(cudaMemsetAsync(grad_kv, 0, shape.num_keys * shape.dim_qk * 4, stream), "memset");
  if (shape.num_queries == 0 || shape.heads == 0) return;
  BwdArgs g{};
  g.grad_out = static_cast<const bf16*>(grad_out);
  g.lse = lse;
  g.grad_q = static_cast<bf16*>(grad_q);
  g.grad_key = grad_kv;
  UnionPlan plan;
  auto* base = static_cast<unsigned char*>(workspace);
  base += build_plan(shape, indices, 1, base, plan, stream);
  g.delta = row_deltas(shape, out, grad_out, base, stream);
  const Problem p = make_problem(shape, q, kv, kv, indices, scale, 1, plan);
  dispatch_dims(shape.dim_qk, shape.dim_v, [&](auto traits) {
    using Tr = SparseAttnLatentBwdTraits<decltype(traits)::kDimQk, decltype(traits)::kDimV>;
    if constexpr (Tr::kSupported) {
      // The query's 64-head blocks are adjacent in the grid: pairs of them form the clusters.
      const bool paired = Tr::kPairable && shape.heads % (2 * Tr::kRows) == 0;
      auto kernel = sparse_attn_bwd_latent_kernel<Tr, false>;
      if constexpr (Tr::kPairable) {
        if (paired) kernel = sparse_attn_bwd_latent_kernel<Tr, true>;
      }
      check(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
          "backward smem");
      g.resident_queries = static_cast<int>(resident_blocks(kernel, Tr::kThreads, Tr::kSmemBytes) /
                                            ceil_div(shape.heads, Tr::kRows));
      cudaLaunchConfig_t config{};
      config.gridDim = grid_of(shape, p);
      config.blockDim = dim3(Tr::kThreads);
      config.dynamicSmemBytes = Tr::kSmemBytes;
      config.stream = stream;
      cudaLaunchAttribute cluster{};
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = paired ? 2 : 1;
      cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
      config.attrs = &cluster;
      config.numAttrs = 1;
      check(cudaLaunchKernelEx(&config, kernel, p, g), "sparse_attn_bwd_latent_kernel");
    }
  });
}

}  // namespace hyscale::cuda
