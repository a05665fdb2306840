// Backward on wgmma (SparseAttnWgmmaTraits), for the blocks the wgmma forward takes. Both kernels
// share the front half of a 32-key tile: warpgroup 0 computes S = Q K^T and P while warpgroup 1
// computes dP = dO V^T; P crosses in shared memory (fp32) and warpgroup 1 forms
// dS = scale P (dP - D). Q and dO stay in shared memory for the whole block.
#pragma once

#include "kernels/cuda/sparse_attn/bwd_common.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda::attn {

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

}  // namespace hyscale::cuda::attn
