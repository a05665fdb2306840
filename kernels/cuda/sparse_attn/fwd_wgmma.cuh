// Forward on wgmma (SparseAttnWgmmaTraits): one block per (query, 64 heads), two warpgroups.
// Per 64-key tile j: S = Q K^T with warpgroup w taking keys 32w.. (m64n32, both operands in shared
// memory); the row maxima of both halves meet in shared memory; P (bf16) goes to shared memory;
// warpgroup w adds P V (m64 x d_v/2, V read MN-major) into its value columns.
#pragma once

#include "kernels/cuda/sparse_attn/fwd_common.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda::attn {

// Separate values: K(j+1) streams in during the softmax and P V of tile j, V(j+1) during S of
// tile j+1, as in the mma.sync kernel. (Values inside the keys take the warp-specialized kernel
// of fwd_latent.cuh.)
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

}  // namespace hyscale::cuda::attn
