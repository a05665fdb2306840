// Warpgroup-level lightning-indexer scoring on Hopper tensor cores (wgmma, sm_90a): the one
// routine behind flash_topk, index_score_gather and the score-table baseline, so all three give
// bit-identical scores.
//
// A warpgroup (4 warps) scores one query against a tile of 64 keys: D[64 keys x H_I heads] =
// K_tile[64 x d] * Q^T[d x H_I], both operands in shared memory in wgmma's 128-byte-swizzled
// K-major layout, read by wgmma through matrix descriptors.
// Warp w's accumulators hold keys 16w + g and 16w + g + 8 (g = lane/4) for 2 heads of every n8
// tile, so ReLU and the head weights are per-lane FMAs and two shuffles finish the head sum.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/index_tile_traits.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda {

// Issues (does not wait for) the products of a 64-key tile with kQueries queries (bf16 or fp8, as
// Traits says): rows
// first_row.. of a kQueryRows-row query tile, one query's H_I head rows after another (N =
// kQueries * H_I). Accumulators: the n8 column group j of query q is acc[4 * (q * kNTiles + j)
// ...]. Callers fence before (wgmma_fence) and commit after (wgmma_commit).
template <class Traits, int kQueries, int kQueryRows>
__device__ __forceinline__ void issue_key_tile(const __nv_bfloat16* key_tile,
                                               const __nv_bfloat16* queries, int first_row,
                                               float (&acc)[kQueries * Traits::kHeads / 2]) {
  const uint64_t keys = matrix_descriptor<Traits::kKeysPerTile>(key_tile, 0, 0);
  const uint64_t query_rows = matrix_descriptor<kQueryRows>(queries, first_row, 0);
#pragma unroll
  for (int ks = 0; ks < Traits::kKSteps; ++ks) {
    Wgmma<kQueries * Traits::kHeads, 0, typename Traits::Element>::run(
        acc, advance_descriptor<Traits::kKeysPerTile>(keys, ks),
        advance_descriptor<kQueryRows>(query_rows, ks), ks > 0);
  }
}

// The head weights a lane needs: heads 8*j + 2*(lane%4) + {0,1} for every n8 tile j.
template <class Traits>
__device__ __forceinline__ void load_lane_weights(const float* w_row, int lane,
                                                  float (&weights)[Traits::kHeadsPerLane]) {
#pragma unroll
  for (int j = 0; j < Traits::kNTiles; ++j) {
    const float2 pair = *reinterpret_cast<const float2*>(w_row + j * 8 + 2 * (lane % 4));
    weights[2 * j] = pair.x;
    weights[2 * j + 1] = pair.y;
  }
}

// Finishes query kQuery of a completed tile: score[s] = sum_h w[h] * ReLU(q[h] . k[s]) for the
// warp's keys 16*warp + lane/4 (.x) and 16*warp + lane/4 + 8 (.y); all four lanes of a quad get the
// same bits.
template <class Traits, int kQuery, int kAccumulators>
__device__ __forceinline__ float2 reduce_heads(const float (&acc)[kAccumulators],
                                               const float (&weights)[Traits::kHeadsPerLane]) {
  constexpr int kFirst = 4 * kQuery * Traits::kNTiles;
  static_assert(kFirst + 4 * Traits::kNTiles <= kAccumulators, "query out of range");
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int j = 0; j < Traits::kNTiles; ++j) {
    lo = __fmaf_rn(weights[2 * j], fmaxf(acc[kFirst + 4 * j], 0.f), lo);
    lo = __fmaf_rn(weights[2 * j + 1], fmaxf(acc[kFirst + 4 * j + 1], 0.f), lo);
    hi = __fmaf_rn(weights[2 * j], fmaxf(acc[kFirst + 4 * j + 2], 0.f), hi);
    hi = __fmaf_rn(weights[2 * j + 1], fmaxf(acc[kFirst + 4 * j + 3], 0.f), hi);
  }
  // The quad's four lanes hold the other heads of the same keys; the butterfly gives every lane
  // the same bits (fp addition is commutative).
  lo += __shfl_xor_sync(0xffffffffu, lo, 1);
  lo += __shfl_xor_sync(0xffffffffu, lo, 2);
  hi += __shfl_xor_sync(0xffffffffu, hi, 1);
  hi += __shfl_xor_sync(0xffffffffu, hi, 2);
  return make_float2(lo, hi);
}

// Where head h's ReLU gate lies in a pair's 64-bit word of gate bits: the lane that holds the head
// (h % 8 / 2 of its quad) owns bits 16 (h % 8 / 2).., and in them heads 8 j + 2 (lane % 4) + e lie
// at bit 8 e + j, as gate_bits packs them.
__host__ __device__ constexpr int gate_bit_position(int head) {
  return 16 * (head % 8 / 2) + 8 * (head % 2) + head / 8;
}

// The ReLU gates of query kQuery of a completed tile: this lane's 16 bits (gate_bit_position) of
// the word of the warp's key 16 warp + lane / 4 (.x) and of that + 8 (.y), whose products
// reduce_heads gates. A product's sign is read after rounding it to bf16 (two heads a packed
// compare), the same as fp32's but for magnitudes under 2^-126.
// (The dense warm-up's backward reads them instead of computing the products again.)
template <class Traits, int kQuery, int kAccumulators>
__device__ __forceinline__ uint2 gate_bits(const float (&acc)[kAccumulators]) {
  constexpr int kFirst = 4 * kQuery * Traits::kNTiles;
  static_assert(kFirst + 4 * Traits::kNTiles <= kAccumulators, "query out of range");
  const __nv_bfloat162 zero = __float2bfloat162_rn(0.f);
  uint32_t lo = 0u, hi = 0u;  // heads 8 j + 2 (lane % 4) + e at bit 16 e + j
#pragma unroll
  for (int j = 0; j < Traits::kNTiles; ++j) {
    const uint32_t mine = (1u << j) | (1u << (16 + j));
    lo |= __hgt2_mask(__floats2bfloat162_rn(acc[kFirst + 4 * j], acc[kFirst + 4 * j + 1]), zero) &
          mine;
    hi |=
        __hgt2_mask(__floats2bfloat162_rn(acc[kFirst + 4 * j + 2], acc[kFirst + 4 * j + 3]), zero) &
        mine;
  }
  // Bytes 0 and 2: e = 1's bits move to 8 + j.
  return make_uint2(__byte_perm(lo, 0u, 0x4420), __byte_perm(hi, 0u, 0x4420));
}

// The tile key whose score lane `lane` of warp `warp` (of its warpgroup) emits: lanes with
// lane%4 == 0 emit .x, lane%4 == 1 emit .y, the other two lanes emit nothing (-1).
__device__ __forceinline__ int emitted_key(int warp, int lane) {
  const int quad_lane = lane % 4;
  return quad_lane < 2 ? 16 * warp + lane / 4 + 8 * quad_lane : -1;
}

}  // namespace hyscale::cuda
