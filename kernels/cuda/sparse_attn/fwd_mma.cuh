// Forward on mma.sync (SparseAttnTraits), any G. Warp (rw, cw): rows 16 rw .. 16 rw + 15; S for
// keys 32 cw .. 32 cw + 31 of the tile, O for value columns cw * d_v/2 ... Row maxima and sums are
// combined across the two column warps through shared memory; P goes through shared memory (bf16)
// to the P V product. K and V tiles are single-buffered but loaded one phase ahead: K(j+1) streams
// in during the softmax and P V of tile j, V(j+1) during Q K^T of tile j+1.
#pragma once

#include "kernels/cuda/sparse_attn/fwd_common.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"

namespace hyscale::cuda::attn {

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

}  // namespace hyscale::cuda::attn
