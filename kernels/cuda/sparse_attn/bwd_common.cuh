// What the backward kernels share: their arguments, what a thread knows of its rows, dq's stores,
// and the mma.sync key-gradient tiles (of the mma.sync kernel and the wgmma dkv kernel).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/fixed_point_accumulate.cuh"
#include "kernels/cuda/sparse_attn/common.cuh"

namespace hyscale::cuda::attn {

// The passes of the mma.sync and wgmma backwards (bwd_mma.cuh says what each does).
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
  // The latent backward's optional by-product: P summed over heads at each (query, slot), [N,
  // topk] fp32, zeroed by the launcher (null: not asked for).
  float* mass;
};

// Fixed-point scales (fixed_point_accumulate.cuh) from bounds no partial sum can exceed:
//   |dvalue| <= N H max|dO|, |dkey| <= N H 2 d_v max|dO| max|v| max|q| scale.
inline __device__ void fixed_scales(const Problem& p, int dim_v, const float* amax,
                                    double& key_scale, double& value_scale) {
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

inline __device__ BwdRows bwd_rows(const Problem& p, const BwdArgs& g, int grp, int h0, int ra) {
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

}  // namespace hyscale::cuda::attn
