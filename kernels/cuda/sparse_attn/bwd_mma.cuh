// Backward on mma.sync (SparseAttnTraits), any G: one kernel body, three modes. Per key tile of 32:
// S = Q K^T and dP = dO V^T (warp (rw, cw): rows 16 rw.., keys 16 cw..), P = exp(S - lse), dS =
// scale * P (dP - D) with D = rowsum(dO * O); P and dS go to shared memory (bf16). Then
//   kDq:       dQ += dS K, kept in registers (warp: rows 16 rw.., columns cw * d_qk/2 ..);
//   kDkv*:     dV_tile = P^T dO and dK_tile = dS^T Q (warp: keys 16 (w & 1).., column quarter
//              w >> 1), added into the shared keys: fp32 atomics (kDkvAtomic) or 64-bit
//              fixed-point integer atomics (kDkvFixed, deterministic).
#pragma once

#include "kernels/cuda/sparse_attn/bwd_common.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"

namespace hyscale::cuda::attn {

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
    mma_block_by_nk<DQ>(s, sq, rw * 16, sk, cw * 16, lane);
    mma_block_by_nk<DV>(dp, sdo, rw * 16, sv, cw * 16, lane);
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

}  // namespace hyscale::cuda::attn
