// The indexer's training path on the GPU: index-score backward at the selected keys and the KL
// loss between the indexer's scores and its target (indexer_loss_cuda.h). The target itself (the
// main-attention mass at the selected keys) runs on tensor cores through cuBLAS, in
// kernels/torch/cuda.cc.
//
// The index-score backward never touches an [N, M] table: a warpgroup owns one query row and walks
// its selected keys in gathered tiles of 64 (indexer_loss_traits.cuh), its three products per tile
// on tensor cores (wgmma, sm_90a), the scores' product being flash_topk's own.
//
// grad_k sums over the rows that selected a key, with fp32 bulk reductions in L2 or, in the
// deterministic mode, with 64-bit fixed-point integer atomics (fixed_point_accumulate.cuh): the
// same bits every run.
//
// The dense warm-up, where every row sees its whole prefix, splits the backward instead: a
// query-major kernel over the rows' prefixes for grad_q and grad_w only, and a key-major kernel
// that owns tiles of keys and sums their gradient over the rows in registers. That costs one more
// product a pair (the scores again) and saves the reductions, which at 128K would move 4 TB a
// layer. Both run three warpgroups a block that share each operand landed from L2.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/fixed_point_accumulate.cuh"
#include "kernels/cuda/index_score_warpgroup.cuh"
#include "kernels/cuda/indexer_loss_cuda.h"
#include "kernels/cuda/indexer_loss_traits.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/warp_specialization.cuh"

namespace hyscale::cuda {
namespace {

constexpr float kNegInf = -INFINITY;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// The row of the calling thread's warp in the kernels of one warp per row (RowWarpTraits), and
// its lane.
struct WarpRow {
  int64_t row;
  int lane;
};
__device__ __forceinline__ WarpRow warp_row() {
  return {static_cast<int64_t>(blockIdx.x) * RowWarpTraits::kRowsPerBlock + threadIdx.x / 32,
          static_cast<int>(threadIdx.x % 32)};
}

// ---- index_score_backward ---------------------------------------------------------------------

// grad_k's fixed-point scale, from a bound no partial sum of grad_k[s] can exceed. grad_k[s] sums,
// over the (query t, slot i) pairs that selected s, sum_j c[t, j, i] q[t, j] with
// c[t, j, i] = g[t, i] w[t, j] (0 where the gate is closed), so any partial sum is at most
//   sum_t G_t W_t max|q| <= N max_t (G_t W_t) max|q|,  G_t = sum_{valid i} |g[t, i]|,
//                                                     W_t = sum_j |w[t, j]|
// (even if a row repeated a key). max|q| and max_t G_t W_t are maxima: the same every run.
struct GradKScaleOf {
  int64_t num_queries;
  const float* bounds;  // [2]: max|q|, max_t G_t W_t
  __device__ double operator()() const {
    return fixed_point_scale(double(num_queries) * bounds[0] * bounds[1]);
  }
};

// max_t G_t W_t (see GradKScaleOf) into *out (zeroed by the caller), one warp per row. Where the
// gradients are formed from the KL (grad_loss given), G_t = sum_i |grad_loss_t (p_i - target_i)|
// <= 2 |grad_loss_t|: p and the target each sum to 1 over the row (p to rounding, which the
// scale's 4x headroom covers).
__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    row_grad_bound_kernel(int64_t rows, int64_t heads, int64_t topk, const float* w,
                          const int32_t* indices, const float* grad_scores, const float* grad_loss,
                          float* out) {
  const auto [row, lane] = warp_row();
  if (row >= rows) return;
  float g = 0.f, wsum = 0.f;
  for (int64_t i = lane; i < topk && !grad_loss; i += 32) {
    if (indices[row * topk + i] >= 0) g += fabsf(grad_scores[row * topk + i]);
  }
  for (int64_t j = lane; j < heads; j += 32) wsum += fabsf(w[row * heads + j]);
  const float row_grad = grad_loss ? 2.f * fabsf(grad_loss[row]) : warp_sum(g);
  const float bound = row_grad * warp_sum(wsum);
  if (lane == 0) atomic_max_nonnegative(out, bound);
}

// A row's selected keys: slot i of row t is indices[t * topk + i], -1 when unused; grad_scores has
// a row of topk floats a query row, by slot.
struct ListedKeys {
  const int32_t* indices;
  int64_t topk;
  struct Row {
    const int32_t* slots;
    int64_t count;  // slots of the row
  };
  __device__ Row row(int64_t t) const { return {indices + t * topk, topk}; }
};

// Where a row starts its walk of its key tiles (wrapping around). In key order (FlashTopK's) each
// of a row's tiles holds one stretch of its span of keys, and rows start about 1 / R of a row's
// time apart (R blocks resident), so a rotated start (rotated_first_tile) puts the rows in flight
// on one stretch of keys, as the latent backward's RotatedKeys does. That pays where the
// rows' keys and key-gradient rows miss the L2 (128K, random selections) and costs where they do
// not (32K, or local selections: docs/performance.md section 13), so a row rotates only when its
// span of keys (its last slot's key less its first's) is over min_span.
struct TileRotation {
  int resident_rows;  // 0: no row rotates (the deterministic mode)
  int64_t min_span;
  __device__ int first_tile(int64_t row, int tiles, int32_t first_key, int32_t last_key) const {
    if (resident_rows == 0 || first_key < 0 || last_key - first_key <= min_span) return 0;
    return rotated_first_tile(row, resident_rows, tiles);
  }
};

// How the rows kernel adds the keys' gradient: by fp32 bulk reductions, or in 64-bit fixed point
// (deterministic).
enum class KeyGrad { kReduce, kFixed };

// The gates' coefficients of a finished score tile S^T [keys x H_I], for the calling thread's keys
// 16 warp + lane / 4 (gradient g_lo) and that + 8 (g_hi): C^T[i, j] = g_i w_j [S_ij > 0] as the
// bf16 A fragments of the k16 steps over heads, and grad_w's per-lane terms g_i ReLU(S_ij) added
// into head_grad.
template <class Tr>
__device__ __forceinline__ void gate_coefficients(const float (&scores)[Tr::kHeads / 2], float g_lo,
                                                  float g_hi,
                                                  const float (&weights)[Tr::Tile::kHeadsPerLane],
                                                  uint32_t (&coef)[Tr::kHeadSteps][4],
                                                  float (&head_grad)[Tr::Tile::kHeadsPerLane]) {
#pragma unroll
  for (int j = 0; j < Tr::Tile::kNTiles; ++j) {
    float c[4];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float s_lo = scores[4 * j + e], s_hi = scores[4 * j + 2 + e];
      c[e] = s_lo > 0.f ? g_lo * weights[2 * j + e] : 0.f;
      c[2 + e] = s_hi > 0.f ? g_hi * weights[2 * j + e] : 0.f;
      head_grad[2 * j + e] += (s_lo > 0.f ? g_lo * s_lo : 0.f) + (s_hi > 0.f ? g_hi * s_hi : 0.f);
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(c[0], c[1]);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(c[2], c[3]);
    coef[j / 2][2 * (j % 2)] = *reinterpret_cast<const uint32_t*>(&lo);
    coef[j / 2][2 * (j % 2) + 1] = *reinterpret_cast<const uint32_t*>(&hi);
  }
}

// prmt.b32 of (a, b) by `selector`: byte i of the result is byte (selector >> 4 i) & 7 of b:a, or,
// where that nibble's top bit is set, that byte's top bit copied over all eight bits. It turns gate
// bits moved to bytes' top bits into masks of whole bf16 halves, one instruction for two.
// (__byte_perm takes three bits a nibble: it has no sign mode.)
__device__ __forceinline__ uint32_t permute_bytes(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(selector));
  return out;
}

// The same coefficients from the gates' head bits (gate_bits) of the two keys, in the fragments'
// places: heads 8 j + 2 (lane % 4) + e, the lane's 16 bits of each word at 8 e + j. The lane's two
// bytes of both words go to one register (key lo's e = 0, 1, then key hi's); shifted left by 7 - j,
// each byte's top bit is its head 8 j + .. gate, which prmt spreads over the bf16 it keeps.
template <class Tr>
__device__ __forceinline__ void gated_coefficients(uint64_t gates_lo, uint64_t gates_hi, float g_lo,
                                                   float g_hi,
                                                   const float (&weights)[Tr::Tile::kHeadsPerLane],
                                                   int lane, uint32_t (&coef)[Tr::kHeadSteps][4]) {
  const uint32_t lane_bytes = 0x10 * (2 * (lane % 4) + 1) + 2 * (lane % 4);
  const uint32_t bits = permute_bytes(
      permute_bytes(uint32_t(gates_lo), uint32_t(gates_lo >> 32), lane_bytes),
      permute_bytes(uint32_t(gates_hi), uint32_t(gates_hi >> 32), lane_bytes), 0x5410);
#pragma unroll
  for (int j = 0; j < Tr::Tile::kNTiles; ++j) {
    const uint32_t top = bits << (7 - j);
    const __nv_bfloat162 lo =
        __floats2bfloat162_rn(g_lo * weights[2 * j], g_lo * weights[2 * j + 1]);
    const __nv_bfloat162 hi =
        __floats2bfloat162_rn(g_hi * weights[2 * j], g_hi * weights[2 * j + 1]);
    coef[j / 2][2 * (j % 2)] =
        *reinterpret_cast<const uint32_t*>(&lo) & permute_bytes(top, 0, 0x9988);
    coef[j / 2][2 * (j % 2) + 1] =
        *reinterpret_cast<const uint32_t*>(&hi) & permute_bytes(top, 0, 0xBBAA);
  }
}

// S^T [keys x H_I] = K_tile q^T of a landed tile (flash_topk's product, the same gates), waited
// for.
template <class Tr>
__device__ __forceinline__ void score_tile(const __nv_bfloat16* key_tile,
                                           const __nv_bfloat16* query_tile,
                                           float (&scores)[Tr::kHeads / 2]) {
  wgmma_fence();
  issue_key_tile<typename Tr::Tile, 1, Tr::kHeads>(key_tile, query_tile, 0, scores);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(scores);
}

// grad_q^T [d_I x H_I] += K_tile^T C^T: the key tile read MN-major as A, C [H_I x keys]
// (coef_tile, K-major) as B. Issues only: the caller fences, commits and waits.
template <class Tr>
__device__ __forceinline__ void issue_query_grad(
    float (&query_grad)[Tr::kDimBlocks][Tr::kHeads / 2], const __nv_bfloat16* key_tile,
    const __nv_bfloat16* coef_tile) {
#pragma unroll
  for (int m = 0; m < Tr::kDimBlocks; ++m) {
#pragma unroll
    for (int s = 0; s < Tr::kKeySteps; ++s) {
      Wgmma<Tr::kHeads, 0, __nv_bfloat16, 1>::run(
          query_grad[m], mn_major_descriptor<Tr::kKeys>(key_tile, 64 * m, 16 * s),
          matrix_descriptor<Tr::kHeads>(coef_tile, 0, s), 1);
    }
  }
}

// The calling thread's gate coefficients (its A fragments) into C [H_I x keys] in coef_tile, the
// B operand of the query gradient: matrix i of step s is heads 8 (2 s + i / 2) .., keys
// 16 warp + 8 (i % 2) ..
template <class Tr>
__device__ __forceinline__ void store_coefficients(const uint32_t (&coef)[Tr::kHeadSteps][4],
                                                   __nv_bfloat16* coef_tile, int warp, int lane) {
#pragma unroll
  for (int s = 0; s < Tr::kHeadSteps; ++s) {
    const int i = lane / 8, head = 8 * (2 * s + i / 2) + lane % 8;
    stmatrix_x4_trans(coef_tile + swizzled_offset<Tr::kHeads>(head, 2 * warp + i % 2), coef[s]);
  }
}

// grad_q [N, H_I, d_I] of index_score_backward: bf16 (the dtype the projections' backward takes:
// no fp32 copy to write and convert) or fp32.
struct QueryGrad {
  void* data;
  bool bf16;
  __device__ void store(int64_t i, float x) const {
    if (bf16) {
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(x);
    } else {
      static_cast<float*>(data)[i] = x;
    }
  }
};

// The gates' gradients formed in the kernel from the KL on the selection (indexer_loss_backward):
// g_i = grad_loss[t] (exp(s_i - score_lse[t]) - target[t, i]) on valid slots, s_i the index score
// of the tile's products; each row's KL, sum_i target_i (log target_i - s_i + score_lse), into
// loss[t].
struct LossFromTarget {
  const float* target;     // [N, topk], in place of grad_scores
  const float* score_lse;  // [N]
  const float* grad_loss;  // [N]
  float* loss;             // [N]
};

// A row's gradients at the end of its key tiles: grad_q^T [d_I x H_I] from the calling thread's
// accumulators (rows d = 64 m + 16 warp + lane / 4 (+ 8), columns heads 8 j + 2 (lane % 4) (+ 1))
// into grad_q's row `row`, and grad_w's per-lane terms summed across the quads' rows into the
// warp's warp_sums[H_I] (the caller sums the warps).
template <class Tr>
__device__ __forceinline__ void store_row_gradients(
    const float (&query_grad)[Tr::kDimBlocks][Tr::kHeads / 2],
    const float (&head_grad)[Tr::Tile::kHeadsPerLane], float* warp_sums, QueryGrad grad_q,
    int64_t row, int warp, int lane) {
  using Tile = typename Tr::Tile;
#pragma unroll
  for (int h = 0; h < Tile::kHeadsPerLane; ++h) {
    float x = head_grad[h];
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 16);
    if (lane < 4) warp_sums[8 * (h / 2) + 2 * lane + h % 2] = x;
  }
#pragma unroll
  for (int m = 0; m < Tr::kDimBlocks; ++m) {
#pragma unroll
    for (int j = 0; j < Tile::kNTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 64 * m + 16 * warp + lane / 4 + 8 * (e / 2);
        const int head = 8 * j + 2 * (lane % 4) + e % 2;
        grad_q.store((row * Tr::kHeads + head) * Tr::kDim + d, query_grad[m][4 * j + e]);
      }
    }
  }
}

// One warpgroup per query row t, its selected keys 64 at a time (a tile of slots i). Per tile:
//   1. S^T [keys x H_I] = K_tile q_t^T, the product flash_topk scores with (the same gates);
//   2. the gates' coefficients C^T[i, j] = g_i w_j [S_ij > 0] (0 in unused slots), in registers
//      as bf16 A fragments, and grad_w[j] += sum_i g_i ReLU(S_ij) per lane;
//   3. grad_k rows of the tile, C^T q_t [keys x d_I] (A from registers), staged in fp32 and
//      added into grad_k[s_i] by bulk reductions (keys are shared between rows), or in fixed
//      point (kFixed, deterministic);
//   4. grad_q^T [d_I x H_I] += K_tile^T C^T, accumulated in registers across tiles, with C^T
//      stored transposed (C [H_I x keys]) by stmatrix as the K-major B operand and the key tile
//      read MN-major as A.
// The next key tile is gathered (cp.async) while a tile computes, from slots copied into shared
// memory a tile earlier, so a tile waits on no global load but its gradients' (prefetched). One
// barrier a tile; three blocks share an SM (168 registers, 76 KB of shared memory with the
// staging of 64 columns at a time). The tiles are walked from the rotation's first tile on, so
// the ring and the stages go by step, not by tile.
//
// kFromTarget (indexer_loss_backward): the slots' input is the KL's target, and each tile's
// gradients are formed from the scores its products give (LossFromTarget), so no scores or
// gradients of the selection exist outside the kernel.
template <class Tr, KeyGrad kKeyGrad, bool kFromTarget>
__global__ void __launch_bounds__(Tr::kThreads, 3)
    index_score_backward_kernel(const __nv_bfloat16* q, const __nv_bfloat16* keys, const float* w,
                                const int32_t* indices, int64_t topk, const float* grad_scores,
                                LossFromTarget kl, QueryGrad grad_q, float* grad_k, float* grad_w,
                                unsigned long long* fixed_k, GradKScaleOf fixed_scale_of,
                                TileRotation rotation) {
  using Tile = typename Tr::Tile;
  using bf16 = __nv_bfloat16;
  constexpr bool kFixed = kKeyGrad == KeyGrad::kFixed;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The row's slots of steps s, s + 1 (landed) and s + 2 (in flight) during step s.
  __shared__ int32_t slot_ring[Tr::kSlotTiles][Tr::kKeys];
  __shared__ int first_tile;
  bf16* const query_tile = first_aligned_shared<bf16>(smem_raw);
  bf16* const key_tiles = query_tile + Tr::kQueryBytes / 2;
  bf16* const coef_tile = key_tiles + Tr::kStages * Tr::kKeyTileBytes / 2;
  float* const stage = reinterpret_cast<float*>(coef_tile + Tr::kCoefBytes / 2);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  const ListedKeys::Row row_keys = ListedKeys{indices, topk}.row(row);
  // A slot's gradient, or with kFromTarget its target.
  const float* const row_grads = (kFromTarget ? kl.target : grad_scores) + row * topk;
  const int tiles = static_cast<int>(ceil_div(row_keys.count, Tr::kKeys));
  double fixed_scale = 1;
  if constexpr (kFixed) fixed_scale = fixed_scale_of();
  const uint64_t policy = l2_evict_last_policy();
  if constexpr (!kFixed) {
    if (threadIdx.x == 0) {
      first_tile =
          rotation.first_tile(row, tiles, row_keys.slots[0], row_keys.slots[row_keys.count - 1]);
    }
    __syncthreads();
  }
  // The tile of step `step` (first_tile read from shared memory where used: a register held
  // across the loop would spill). The deterministic mode walks from the first tile.
  auto tile_at = [&](int step) {
    if constexpr (kFixed) return step;
    const int tile = first_tile + step;
    return tile < tiles ? tile : tile - tiles;
  };

  // Slot r of step `step`'s tile: its key, -1 when unused or past the row, from the ring (the
  // step's slots have landed).
  auto key_at = [&](int step, int r) {
    return tile_at(step) * Tr::kKeys + r < row_keys.count ? slot_ring[step % Tr::kSlotTiles][r]
                                                          : -1;
  };
  // A step's slots into the ring: the gathers and gates then read them from shared memory, and
  // no global load sits in a tile's chain of waits.
  auto copy_slots = [&](int step) {
    if (threadIdx.x >= Tr::kKeys) return;
    const int slot = tile_at(step) * Tr::kKeys + threadIdx.x;
    cp_async_4(&slot_ring[step % Tr::kSlotTiles][threadIdx.x],
               row_keys.slots + (slot < row_keys.count ? slot : 0), slot < row_keys.count);
  };
  auto gather = [&](int step) {
    load_rows_async<Tr::kDim, Tr::kKeys>(
        key_tiles + (step % Tr::kStages) * (Tr::kKeyTileBytes / 2), 0, Tr::kKeys, threadIdx.x,
        Tr::kThreads, [&](int r) -> const bf16* {
          const int32_t key = key_at(step, r);
          return key >= 0 ? keys + int64_t(key) * Tr::kDim : nullptr;
        });
  };
  // The gates' gradients of a step are fetched into L1 a step ahead (two 128-byte lines).
  auto prefetch_grads = [&](int step) {
    const int slot = tile_at(step) * Tr::kKeys + 32 * threadIdx.x;
    if (threadIdx.x < 2 && slot < row_keys.count) prefetch_l1(row_grads + slot);
  };
  load_rows_async<Tr::kDim, Tr::kHeads>(
      query_tile, 0, Tr::kHeads, threadIdx.x, Tr::kThreads,
      [&](int h) { return q + (row * Tr::kHeads + h) * Tr::kDim; });
  copy_slots(0);
  copy_slots(1);
  cp_async_commit();
  prefetch_grads(0);
  cp_async_wait<0>();
  __syncthreads();
  gather(0);
  cp_async_commit();

  float weights[Tile::kHeadsPerLane], head_grad[Tile::kHeadsPerLane];
  load_lane_weights<Tile>(w + row * Tr::kHeads, lane, weights);
#pragma unroll
  for (int h = 0; h < Tile::kHeadsPerLane; ++h) head_grad[h] = 0.f;
  float query_grad[Tr::kDimBlocks][Tr::kHeads / 2];
#pragma unroll
  for (int m = 0; m < Tr::kDimBlocks; ++m) {
#pragma unroll
    for (int i = 0; i < Tr::kHeads / 2; ++i) query_grad[m][i] = 0.f;
  }
  // This thread's two keys of a tile (the accumulator rows), and its staging rows.
  const int key_lo = 16 * warp + lane / 4, key_hi = key_lo + 8;
  float row_loss = 0.f;  // kFromTarget: the KL's terms of the slots this lane emits

  for (int step = 0; step < tiles; ++step) {
    cp_async_wait<0>();  // this step's tile (and the query) and the next step's slots landed
    fence_async_shared();
    __syncthreads();
    if (step + 1 < tiles) gather(step + 1);
    if (step + 2 < tiles) copy_slots(step + 2);
    cp_async_commit();
    if (step + 1 < tiles) prefetch_grads(step + 1);
    const bf16* const key_tile = key_tiles + (step % Tr::kStages) * (Tr::kKeyTileBytes / 2);
    const int first = tile_at(step) * Tr::kKeys;

    // The gates' gradients (or targets) are loaded before the scores' products, which the loads
    // cannot pass.
    const bool valid_lo = key_at(step, key_lo) >= 0, valid_hi = key_at(step, key_hi) >= 0;
    float g_lo = valid_lo ? row_grads[first + key_lo] : 0.f;
    float g_hi = valid_hi ? row_grads[first + key_hi] : 0.f;
    float scores[Tr::kHeads / 2];
    score_tile<Tr>(key_tile, query_tile, scores);
    if constexpr (kFromTarget) {
      const float lse = kl.score_lse[row], grad_row = kl.grad_loss[row];
      const float2 s = reduce_heads<Tile, 0>(scores, weights);  // the index scores, as the gather's
      // Each valid slot's KL term once: by the lane that emits its score (emitted_key).
      const int quad_lane = lane % 4;
      const float t = quad_lane == 0 ? g_lo : g_hi, mine = quad_lane == 0 ? s.x : s.y;
      if (quad_lane < 2 && (quad_lane == 0 ? valid_lo : valid_hi) && t > 0.f) {
        row_loss += t * (logf(t) - (mine - lse));
      }
      g_lo = valid_lo ? grad_row * (expf(s.x - lse) - g_lo) : 0.f;
      g_hi = valid_hi ? grad_row * (expf(s.y - lse) - g_hi) : 0.f;
    }
    uint32_t coef[Tr::kHeadSteps][4];
    gate_coefficients<Tr>(scores, g_lo, g_hi, weights, coef, head_grad);
    store_coefficients<Tr>(coef, coef_tile, warp, lane);
    fence_async_shared();
    __syncthreads();

    // The key row this lane reduces (lanes 0-15 of a warp: its 16 rows), loaded ahead of the
    // products.
    const int32_t reduce_key = lane < 16 ? key_at(step, 16 * warp + lane) : -1;
    // The key gradient 64 columns of d_I at a time (32 accumulators rather than 64: three blocks
    // an SM), the query gradient's products issued with the first.
#pragma unroll
    for (int cols = 0; cols < Tr::kDimBlocks; ++cols) {
      float key_grad[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) key_grad[i] = 0.f;
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < Tr::kHeadSteps; ++s) {
        WgmmaRegA<64, 1>::run(key_grad, coef[s],
                              mn_major_descriptor<Tr::kHeads>(query_tile, 64 * cols, 16 * s));
      }
      if (cols == 0) issue_query_grad<Tr>(query_grad, key_tile, coef_tile);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(key_grad);
      if (cols == 0) {
#pragma unroll
        for (int m = 0; m < Tr::kDimBlocks; ++m) fence_accumulators(query_grad[m]);
      }

      // The warp's 16 key rows of these columns: staged, then added into grad_k.
      if constexpr (!kFixed) {
        bulk_wait_read<0>();  // the previous reductions have read the staging rows
      }
      __syncwarp();
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float* const dst = stage + (half ? key_hi : key_lo) * Tr::kStageStride + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(key_grad[4 * j + 2 * half], key_grad[4 * j + 2 * half + 1]);
        }
      }
      if constexpr (kFixed) {
        __syncwarp();
        for (int r = 16 * warp; r < 16 * warp + 16; ++r) {
          const int32_t key = key_at(step, r);
          if (key < 0) continue;  // uniform across the warp
          for (int d = lane; d < 64; d += 32) {
            fixed_add(fixed_k + int64_t(key) * Tr::kDim + 64 * cols + d,
                      stage[r * Tr::kStageStride + d], fixed_scale);
          }
        }
        __syncwarp();  // the next columns' staging overwrites these rows
      } else {
        fence_async_shared();
        __syncwarp();
        if (reduce_key >= 0) {
          bulk_reduce_add(grad_k + int64_t(reduce_key) * Tr::kDim + 64 * cols,
                          stage + (16 * warp + lane) * Tr::kStageStride, 64 * 4, policy);
        }
        bulk_commit();
      }
    }
#pragma unroll
    for (int s = 0; s < Tr::kHeadSteps; ++s) fence_operands(coef[s]);
    // The next tile's barrier, before anything refills this tile's key tile, slots or
    // coefficients, also finds every warp done with them.
  }
  // The warps' grad_w sums [4][H_I] (and KL sums [4]) go where the key stage was, once the
  // reductions read it.
  if constexpr (!kFixed) bulk_wait_read<0>();
  __syncthreads();
  float* const head_sums = stage;
  float* const loss_sums = head_sums + 4 * Tr::kHeads;
  store_row_gradients<Tr>(query_grad, head_grad, head_sums + warp * Tr::kHeads, grad_q, row, warp,
                          lane);
  if constexpr (kFromTarget) {
    row_loss = warp_sum(row_loss);
    if (lane == 0) loss_sums[warp] = row_loss;
  }
  __syncthreads();
  for (int h = threadIdx.x; h < Tr::kHeads; h += Tr::kThreads) {
    grad_w[row * Tr::kHeads + h] = head_sums[h] + head_sums[Tr::kHeads + h] +
                                   head_sums[2 * Tr::kHeads + h] + head_sums[3 * Tr::kHeads + h];
  }
  if constexpr (kFromTarget) {
    if (threadIdx.x == 0) kl.loss[row] = loss_sums[0] + loss_sums[1] + loss_sums[2] + loss_sums[3];
  }
  if constexpr (kKeyGrad == KeyGrad::kReduce) bulk_wait_all();  // the staging outlives the block
}

// ---- dense_index_score_backward -----------------------------------------------------------------

// The ring slots of the dense backward's kernels: a tile's slot and the one the tile kStages - 1
// ahead refills (the slot before it).
constexpr int kDenseLookahead = DenseBackwardTraits::kStages - 1;
__device__ __forceinline__ int next_stage(int slot) {
  return slot + 1 == DenseBackwardTraits::kStages ? 0 : slot + 1;
}
__device__ __forceinline__ int previous_stage(int slot) {
  return slot == 0 ? DenseBackwardTraits::kStages - 1 : slot - 1;
}

// The dense backward's ring, without a block barrier a tile: thread 0 has the TMA unit copy all of
// a slot's operands (the tile, the rows' gradients and gates, the head weights) and arrives with
// the bytes it expects; every thread arrives on `empty` once done with the slot, which thread 0
// waits for before refilling it. A warpgroup waits only for the slot it reads (warpgroup 0 also
// for the refill), so the warpgroups run up to a tile apart: one's gate arithmetic overlaps
// another's products instead of all three taking turns with the tensor cores idle, and no thread
// but one spends instructions on the copies.
struct DenseRing {
  uint64_t full[DenseBackwardTraits::kStages];
  uint64_t empty[DenseBackwardTraits::kStages];

  // By thread 0, then a block barrier.
  __device__ void init() {
    for (int s = 0; s < DenseBackwardTraits::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], DenseBackwardTraits::kThreads);
    }
    mbarrier_init_fence();
  }
  // Thread 0, before the slot's copies: their bytes complete the fill.
  __device__ void expect(int slot, uint32_t bytes) { mbarrier_arrive_expect(&full[slot], bytes); }
  // Waits for the slot's fill of the current lap (parity `phase`).
  __device__ void wait_full(int slot, uint32_t phase) { mbarrier_wait(&full[slot], phase); }
  // Waits until every thread is done with the slot's previous lap (`phase` is the lap's parity
  // that is to be filled; a fresh barrier's "lap -1" counts as done).
  __device__ void wait_empty(int slot, uint32_t phase) { mbarrier_wait(&empty[slot], phase ^ 1); }
  __device__ void release(int slot) { mbarrier_arrive(&empty[slot]); }
  // Thread 0 at the tile in `slot` (lap parity `phase`): once every thread is done with the tile
  // before, `stage(refill)` copies the tile kStages - 1 ahead into its slot.
  template <class Stage>
  __device__ void refill_previous(int slot, uint32_t phase, Stage&& stage) {
    const int refill = previous_stage(slot);
    wait_empty(refill, slot == 0 ? phase : phase ^ 1);
    stage(refill);
  }
};

// The dense warm-up's grad_q and grad_w, query-major, with the (row, head) pairs in wgmma's M as
// FlashAttention's dQ has its queries: warpgroup r of a block owns pairs 64 r .. of its rows
// (rows 64 / H_I r .., one at H_I 64) and all three walk the key tiles of the block's last row's
// prefix, which bounds the others' (rows see prefixes); a key tile, the rows' gradients at its
// keys and their gates land kStages - 1 tiles ahead, each a box of the TMA unit (a row's gradient
// is 0 past its prefix, and the unit writes zeros past the last row and key, so those keys add
// nothing whatever their gates). The scores pass kept every pair's ReLU gates as head bits
// (index_score_table), so no product is computed again: per tile, in each warpgroup,
//   U [pairs x d_I] += C K_tile, C[p, i] = g_i [S_pi > 0] built in registers where the A
//   fragments lie, the key tile read MN-major;
// and at the end grad_q_p = w_p U_p and grad_w_p = q_p . U_p (= sum_i g_i ReLU(S_pi)).
// No warpgroup waits on another but for the ring's refills.
template <class Tr>
__global__ void __launch_bounds__(DenseBackwardTraits::kThreads, 1)
    dense_query_grad_kernel(const __nv_bfloat16* q, const __grid_constant__ CUtensorMap key_map,
                            const __grid_constant__ CUtensorMap grad_map,
                            const __grid_constant__ CUtensorMap gate_map, const float* w,
                            PrefixKeys prefix, int64_t rows, float* grad_q, float* grad_w) {
  using D = DenseBackwardTraits;
  using bf16 = __nv_bfloat16;
  constexpr int kPairs = D::kPairsPerWarpgroup;
  constexpr int kGroupRows = D::kRowsPerWarpgroup<Tr>;
  constexpr int kRows = D::kRowsPerBlock<Tr>;
  constexpr int kKeySteps = Tr::kKeys / 16;  // k16 steps over keys (U's K)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16* const key_tiles = first_aligned_shared<bf16>(smem_raw);
  // The rows' gradients and gates, [stage][row][key] each.
  float* const grads = reinterpret_cast<float*>(key_tiles + D::kStages * (Tr::kKeyTileBytes / 2));
  uint64_t* const row_gates = reinterpret_cast<uint64_t*>(grads + D::kStages * kRows * Tr::kKeys);
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int64_t first_row = int64_t(blockIdx.x) * kRows;
  const int live_rows = static_cast<int>(rows - first_row < kRows ? rows - first_row : kRows);
  const int64_t first_pair = first_row * Tr::kHeads + int64_t(wg) * kPairs;  // q's [row, head]
  const int64_t last_seen = prefix.visible(first_row + live_rows - 1);
  // (Not ceil_div: another caller of it moves the sparse kernels' code.)
  const int64_t tiles = (last_seen + Tr::kKeys - 1) / Tr::kKeys;
  // The calling thread's accumulator rows: pairs pair_lo and pair_lo + 8, both of one row.
  const int pair_lo = 16 * warp + lane / 4;
  const int group_row = wg * kGroupRows + pair_lo / Tr::kHeads;  // the block's row of both
  // The pairs' gates are bits p and p + 1 of a key's word (gate_bit_position), both in one of its
  // 32-bit halves: the thread reads that half alone and tests one word a gate.
  const int gate_position = gate_bit_position(pair_lo % Tr::kHeads);
  const int gate_half = gate_position / 32;
  const uint32_t gate_lo = 1u << gate_position % 32, gate_hi = gate_lo << 1;
  auto live_pair = [&](int pair) { return wg * kGroupRows + pair / Tr::kHeads < live_rows; };

  __shared__ DenseRing ring;
  // Tile `tile`'s copies into ring slot `slot` (tile % kStages, kept by the loop by increments:
  // no 64-bit division between one tile's products and the next), by thread 0. Keys past the last
  // row's prefix are real, their gradients 0; past the last key, zeros.
  auto stage = [&](int64_t tile, int slot) {
    const int first = static_cast<int>(tile * Tr::kKeys);
    const uint64_t key_policy = l2_evict_last_policy();     // every row block reads the keys
    const uint64_t table_policy = l2_evict_first_policy();  // this block's rows alone
    ring.expect(slot, Tr::kKeyTileBytes + kRows * Tr::kKeys * (4 + 8));
    bf16* const key_tile = key_tiles + slot * (Tr::kKeyTileBytes / 2);
#pragma unroll
    for (int c = 0; c < Tr::kDim / 64; ++c) {
      tma_load_2d(key_tile + c * Tr::kKeys * 64, &key_map, c * 64, first, &ring.full[slot],
                  key_policy);
    }
    const int row = static_cast<int>(first_row);
    tma_load_2d(grads + slot * kRows * Tr::kKeys, &grad_map, first, row, &ring.full[slot],
                table_policy);
    tma_load_2d(row_gates + slot * kRows * Tr::kKeys, &gate_map, first, row, &ring.full[slot],
                table_policy);
  };
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&key_map);
    prefetch_tensor_map(&grad_map);
    prefetch_tensor_map(&gate_map);
    ring.init();
    for (int ahead = 0; ahead < kDenseLookahead && ahead < tiles; ++ahead) stage(ahead, ahead);
  }
  __syncthreads();  // the barriers

  float u[Tr::kDim / 2];
#pragma unroll
  for (int i = 0; i < Tr::kDim / 2; ++i) u[i] = 0.f;
  fence_accumulators(u);

  // Per tile: its gradients and gates read, the tile before's product waited for (which frees
  // its slot and coef: ptxas serializes wgmmas whose register operands are written while one is
  // in flight), its coefficients built and its product issued; then the refill of the slot the
  // tile before held, which waits for every warpgroup, overlaps this product. Pairs past the
  // last row compute too (their gradients are zeros: they add nothing) and store nothing, so that
  // no wgmma sits on a branch ptxas cannot prove uniform.
  uint32_t coef[kKeySteps][4];
  int slot = 0;
  uint32_t phase = 0;  // tile / kStages's parity, kept by increments like the slot
  for (int64_t tile = 0; tile < tiles; ++tile) {
    ring.wait_full(slot, phase);
    // Accumulators 4 j + e: keys 8 j + 2 (lane % 4) + e % 2 of pair pair_lo (e < 2) or + 8.
    const int at = (slot * kRows + group_row) * Tr::kKeys + 2 * (lane % 4);
    const uint32_t* const gate_halves = reinterpret_cast<const uint32_t*>(row_gates) + gate_half;
    float2 g[Tr::kKeys / 8];
    uint2 gate[Tr::kKeys / 8];  // the keys' halves of their words
#pragma unroll
    for (int j = 0; j < Tr::kKeys / 8; ++j) {
      g[j] = *reinterpret_cast<const float2*>(grads + at + 8 * j);
      gate[j] = make_uint2(gate_halves[2 * (at + 8 * j)], gate_halves[2 * (at + 8 * j + 1)]);
    }
    if (tile > 0) {  // the tile before's product
      wgmma_wait<0>();
      fence_accumulators(u);
#pragma unroll
      for (int s = 0; s < kKeySteps; ++s) fence_operands(coef[s]);
      ring.release(previous_stage(slot));
    }
#pragma unroll
    for (int j = 0; j < Tr::kKeys / 8; ++j) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(gate[j].x & gate_lo ? g[j].x : 0.f,
                                                      gate[j].y & gate_lo ? g[j].y : 0.f);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(gate[j].x & gate_hi ? g[j].x : 0.f,
                                                      gate[j].y & gate_hi ? g[j].y : 0.f);
      coef[j / 2][2 * (j % 2)] = *reinterpret_cast<const uint32_t*>(&lo);
      coef[j / 2][2 * (j % 2) + 1] = *reinterpret_cast<const uint32_t*>(&hi);
    }
    const bf16* const key_tile = key_tiles + slot * (Tr::kKeyTileBytes / 2);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kKeySteps; ++s) {
      WgmmaRegA<Tr::kDim, 1>::run(u, coef[s], mn_major_descriptor<Tr::kKeys>(key_tile, 0, 16 * s));
    }
    wgmma_commit();
    if (threadIdx.x == 0 && tile + kDenseLookahead < tiles) {
      ring.refill_previous(slot, phase, [&](int refill) { stage(tile + kDenseLookahead, refill); });
    }
    if ((slot = next_stage(slot)) == 0) phase ^= 1;
  }
  wgmma_wait<0>();
  fence_accumulators(u);
#pragma unroll
  for (int s = 0; s < kKeySteps; ++s) fence_operands(coef[s]);

  // grad_q = w U and grad_w = q . U, the dot over the quad's lanes (the pair's other columns).
  float head_grad[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int pair = pair_lo + 8 * half;
    // (A pair past the last row reads the block's first pair instead: its sum is not stored.)
    const int64_t read_pair = live_pair(pair) ? first_pair + pair : first_row * Tr::kHeads;
    const bf16* const q_pair = q + read_pair * Tr::kDim + 2 * (lane % 4);
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < Tr::kDim / 8; ++j) {
      const float2 qj =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(q_pair + 8 * j));
      dot = __fmaf_rn(qj.x, u[4 * j + 2 * half], dot);
      dot = __fmaf_rn(qj.y, u[4 * j + 2 * half + 1], dot);
    }
    head_grad[half] = dot;
  }
#pragma unroll
  for (int x = 1; x < 4; x *= 2) {
    head_grad[0] += __shfl_xor_sync(0xffffffffu, head_grad[0], x);
    head_grad[1] += __shfl_xor_sync(0xffffffffu, head_grad[1], x);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int pair = pair_lo + 8 * half;
    if (!live_pair(pair)) continue;
    if (lane % 4 == 0) grad_w[first_pair + pair] = head_grad[half];
    const float weight = w[first_pair + pair];
    float* const dst = grad_q + (first_pair + pair) * Tr::kDim + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Tr::kDim / 8; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j) =
          make_float2(weight * u[4 * j + 2 * half], weight * u[4 * j + 2 * half + 1]);
    }
  }
}

// The dense warm-up's key gradient, key-major: a block owns kTiles 64-key tiles and walks the
// rows that see its first key, in order, kSplits rows a step (DenseBackwardTraits); warpgroup
// (tile, split) takes its tile against row first + kSplits step + split. A step's queries, their
// gradients and gates at the block's keys (0 where the row does not see the key) and head weights
// land kStages - 1 steps ahead, boxes of the TMA unit. Per row t, in a warpgroup, from the gates
// the scores pass kept (no product computed again):
//   1. C^T[i, j] = g_ti w_tj [S_ij > 0] in registers where the A fragments lie
//   (gated_coefficients);
//   2. grad_k[tile] += C^T q_t [keys x d_I], accumulated across rows.
// With kSplits > 1 the splits' sums meet in shared memory and split 0 adds them in order; a tile
// has one owner, which adds it into grad_k once: no reductions, the same bits every run.
template <class Tr, int kTiles, int kSplits>
__global__ void __launch_bounds__(DenseBackwardTraits::kThreads, 1)
    dense_key_grad_kernel(const __grid_constant__ CUtensorMap query_map,
                          const __grid_constant__ CUtensorMap grad_map,
                          const __grid_constant__ CUtensorMap gate_map,
                          const __grid_constant__ CUtensorMap weight_map, PrefixKeys prefix,
                          int64_t rows, float* grad_k) {
  using D = DenseBackwardTraits;
  using L = DenseKeyGradLayout<Tr, kTiles, kSplits>;
  using Tile = typename Tr::Tile;
  using bf16 = __nv_bfloat16;
  constexpr int kBlockKeys = L::kBlockKeys;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16* const query_ring = first_aligned_shared<bf16>(smem_raw);  // [stage][split]
  float* const grad_ring =                                        // [stage][split][kBlockKeys]
      reinterpret_cast<float*>(query_ring + D::kStages * kSplits * (Tr::kQueryBytes / 2));
  float* const weight_ring = grad_ring + D::kStages * L::kGradSlotFloats;  // [stage][split][H_I]
  uint64_t* const gate_ring =  // [stage][split][kBlockKeys]
      reinterpret_cast<uint64_t*>(weight_ring + D::kStages * L::kWeightSlotFloats);
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int tile = wg % kTiles, split = wg / kTiles;
  const int64_t block_key = int64_t(blockIdx.x) * kBlockKeys;
  const int64_t first_row = prefix.first_row_seeing(block_key);
  if (first_row >= rows) return;  // (the block's last row sees every key)
  const int64_t steps = (rows - first_row + kSplits - 1) / kSplits;
  const int64_t first_key = block_key + tile * Tr::kKeys;
  const int key_lo = 16 * warp + lane / 4, key_hi = key_lo + 8;  // of the warpgroup's tile

  __shared__ DenseRing ring;
  // Step `step`'s copies into ring slot `slot` (step % kStages, kept by the loop by increments),
  // by thread 0: the step's rows' queries, their gradients and gates at the block's keys and their
  // head weights (rows past the last, and keys past the last: zeros; a row's gradient is 0 at the
  // keys it does not see).
  auto stage = [&](int64_t step, int slot) {
    const uint64_t shared_policy = l2_evict_last_policy();  // every key block reads them
    const uint64_t table_policy = l2_evict_first_policy();  // this block's keys alone
    const int64_t first = first_row + step * kSplits;
    ring.expect(slot, kSplits * Tr::kQueryBytes + L::kTableBytesPerStep);
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      bf16* const query_tile = query_ring + (slot * kSplits + s) * (Tr::kQueryBytes / 2);
#pragma unroll
      for (int c = 0; c < Tr::kDim / 64; ++c) {
        tma_load_2d(query_tile + c * Tr::kHeads * 64, &query_map, c * 64,
                    static_cast<int>((first + s) * Tr::kHeads), &ring.full[slot], shared_policy);
      }
    }
    const int row = static_cast<int>(first), key = static_cast<int>(block_key);
    tma_load_2d(grad_ring + slot * L::kGradSlotFloats, &grad_map, key, row, &ring.full[slot],
                table_policy);
    tma_load_2d(gate_ring + slot * kSplits * kBlockKeys, &gate_map, key, row, &ring.full[slot],
                table_policy);
    tma_load_2d(weight_ring + slot * L::kWeightSlotFloats, &weight_map, 0, row, &ring.full[slot],
                shared_policy);
  };
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&query_map);
    prefetch_tensor_map(&grad_map);
    prefetch_tensor_map(&gate_map);
    prefetch_tensor_map(&weight_map);
    ring.init();
    for (int ahead = 0; ahead < kDenseLookahead && ahead < steps; ++ahead) stage(ahead, ahead);
  }
  __syncthreads();

  float key_grad[Tr::kDim / 2];
#pragma unroll
  for (int i = 0; i < Tr::kDim / 2; ++i) key_grad[i] = 0.f;
  fence_accumulators(key_grad);

  // Per step as in the rows kernel: the row's gradients, gates and weights read, the step
  // before's product waited for (freeing its slot and coef), the coefficients built and the
  // product issued, then the refill that waits for every warpgroup. The last step's spare splits
  // compute too (their query, gradients and weights are zeros: they add nothing), so that no
  // wgmma sits on a branch ptxas cannot prove uniform.
  uint32_t coef[Tr::kHeadSteps][4];
  int slot = 0;
  uint32_t phase = 0;  // step / kStages's parity, kept by increments like the slot
  for (int64_t step = 0; step < steps; ++step) {
    ring.wait_full(slot, phase);
    const int row_slot = slot * kSplits + split;
    const float* const staged = grad_ring + slot * L::kGradSlotFloats + split * kBlockKeys;
    const uint64_t* const staged_gates = gate_ring + row_slot * kBlockKeys + tile * Tr::kKeys;
    float weights[Tile::kHeadsPerLane];
    load_lane_weights<Tile>(weight_ring + slot * L::kWeightSlotFloats + split * Tr::kHeads, lane,
                            weights);
    const float g_lo = staged[tile * Tr::kKeys + key_lo], g_hi = staged[tile * Tr::kKeys + key_hi];
    const uint64_t gates_lo = staged_gates[key_lo], gates_hi = staged_gates[key_hi];
    if (step > 0) {  // the step before's product
      wgmma_wait<0>();
      fence_accumulators(key_grad);
#pragma unroll
      for (int s = 0; s < Tr::kHeadSteps; ++s) fence_operands(coef[s]);
      ring.release(previous_stage(slot));
    }
    gated_coefficients<Tr>(gates_lo, gates_hi, g_lo, g_hi, weights, lane, coef);
    const bf16* const query_tile = query_ring + row_slot * (Tr::kQueryBytes / 2);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < Tr::kHeadSteps; ++s) {
      WgmmaRegA<Tr::kDim, 1>::run(key_grad, coef[s],
                                  mn_major_descriptor<Tr::kHeads>(query_tile, 0, 16 * s));
    }
    wgmma_commit();
    if (threadIdx.x == 0 && step + kDenseLookahead < steps) {
      ring.refill_previous(slot, phase, [&](int refill) { stage(step + kDenseLookahead, refill); });
    }
    if ((slot = next_stage(slot)) == 0) phase ^= 1;
  }
  wgmma_wait<0>();
  fence_accumulators(key_grad);
#pragma unroll
  for (int s = 0; s < Tr::kHeadSteps; ++s) fence_operands(coef[s]);

  if constexpr (kSplits > 1) {
    // The splits' sums, [split - 1][tile][accumulator][thread], over the ring.
    auto* const partials = reinterpret_cast<float*>(query_ring);
    auto partial = [&](int s) {
      return partials + ((s - 1) * kTiles + tile) * (Tr::kDim / 2) * 128 + threadIdx.x % 128;
    };
    __syncthreads();  // every warpgroup is done with the ring
    if (split > 0) {
      float* const dst = partial(split);
#pragma unroll
      for (int i = 0; i < Tr::kDim / 2; ++i) dst[i * 128] = key_grad[i];
    }
    __syncthreads();
    if (split > 0) return;
#pragma unroll 1
    for (int s = 1; s < kSplits; ++s) {
      const float* const src = partial(s);
#pragma unroll
      for (int i = 0; i < Tr::kDim / 2; ++i) key_grad[i] += src[i * 128];
    }
  }

  // The tile's rows into grad_k: key key_lo (key_hi), columns 8 j + 2 (lane % 4) (+ 1).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t key = first_key + (half ? key_hi : key_lo);
    if (key >= prefix.num_keys) continue;
    float* const dst = grad_k + key * Tr::kDim + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Tr::kDim / 8; ++j) {
      float2 sum = *reinterpret_cast<const float2*>(dst + 8 * j);
      sum.x += key_grad[4 * j + 2 * half];
      sum.y += key_grad[4 * j + 2 * half + 1];
      *reinterpret_cast<float2*>(dst + 8 * j) = sum;
    }
  }
}

// ---- indexer_kl ---------------------------------------------------------------------------------

// Log-sum-exp of a row's valid scores, in every lane of the warp; -infinity when it has none.
__device__ float row_logsumexp(const float* s, int64_t topk, int lane) {
  float max_score = kNegInf;
  for (int64_t i = lane; i < topk; i += 32) max_score = fmaxf(max_score, s[i]);
  max_score = warp_max(max_score);
  if (max_score == kNegInf) return kNegInf;
  float sum = 0.f;
  for (int64_t i = lane; i < topk; i += 32) sum += expf(s[i] - max_score);  // exp(-inf) = 0
  return max_score + logf(warp_sum(sum));
}

__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    indexer_kl_fwd_kernel(int64_t rows, int64_t topk, const float* score, const float* target,
                          float* loss) {
  const auto [row, lane] = warp_row();
  if (row >= rows) return;
  const float* s = score + row * topk;
  const float* p = target + row * topk;
  const float lse = row_logsumexp(s, topk, lane);
  float total = 0.f;
  for (int64_t i = lane; i < topk; i += 32) {
    if (s[i] != kNegInf && p[i] > 0.f) total += p[i] * (logf(p[i]) - (s[i] - lse));
  }
  total = warp_sum(total);
  if (lane == 0) loss[row] = total;
}

__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    indexer_kl_bwd_kernel(int64_t rows, int64_t topk, const float* score, const float* target,
                          const float* grad_loss, float* grad_score) {
  const auto [row, lane] = warp_row();
  if (row >= rows) return;
  const float* s = score + row * topk;
  const float* p = target + row * topk;
  float* g = grad_score + row * topk;
  const float lse = row_logsumexp(s, topk, lane);
  const float scale = grad_loss[row];
  for (int64_t i = lane; i < topk; i += 32) {
    g[i] = s[i] != kNegInf ? scale * (expf(s[i] - lse) - p[i]) : 0.f;
  }
}

// ---- dense_indexer_kl_rows ----------------------------------------------------------------------

// Running (max, sum of exp(x - max)) pairs, combined; -infinity max with sum 0 for none.
struct RunningExpSum {
  float max = kNegInf;
  float sum = 0.f;
  __device__ void add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.f;  // exp(-inf) = 0 for the first
      max = x;
    } else if (x != kNegInf) {
      sum += expf(x - max);
    }
  }
  // Four values at once: one rescale at most, for their maximum.
  __device__ void add(float4 x) {
    const float top = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
    if (top > max) {
      sum *= expf(max - top);  // 0 for the first
      max = top;
    }
    if (max != kNegInf)
      sum += expf(x.x - max) + expf(x.y - max) + expf(x.z - max) + expf(x.w - max);
  }
  __device__ void merge(float other_max, float other_sum) {
    const float top = fmaxf(max, other_max);
    if (top == kNegInf) return;
    sum = (max == kNegInf ? 0.f : sum * expf(max - top)) +
          (other_max == kNegInf ? 0.f : other_sum * expf(other_max - top));
    max = top;
  }
  __device__ float log_sum_exp() const { return max == kNegInf ? kNegInf : max + logf(sum); }
};

// One key's share of the loss (added to total) and its gradient softmax - target (0 where the
// score is -infinity: the row does not see the key).
__device__ __forceinline__ float kl_term(float score, float target, float lse, float& total) {
  if (score == kNegInf) return 0.f;
  const float log_q = score - lse;
  if (target > 0.f) total += target * (logf(target) - log_q);
  return expf(log_q) - target;
}

// A block a row: the log-sum-exp of its scores in one pass, then a pass that sums the loss and
// writes softmax - target over the target. Both read 16 bytes a thread where the row starts on 16
// (a row of 4 B loads keeps too few bytes in flight to stream at HBM's rate). The same order of
// additions every run.
__global__ void __launch_bounds__(DenseKlTraits::kThreads)
    dense_indexer_kl_rows_kernel(int64_t keys, const float* score, int64_t score_stride,
                                 float* target_grad, int64_t target_stride, float* loss) {
  constexpr int kThreads = DenseKlTraits::kThreads;
  __shared__ float partial_max[DenseKlTraits::kWarps], partial[DenseKlTraits::kWarps];
  __shared__ float row_lse;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* s = score + blockIdx.x * score_stride;
  float* p = target_grad + blockIdx.x * target_stride;
  const bool aligned =
      (reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(p)) % sizeof(float4) == 0;
  const int64_t vector_end = aligned ? keys / 4 * 4 : 0;

  RunningExpSum running;
  for (int64_t i = 4 * threadIdx.x; i < vector_end; i += 4 * kThreads) {
    running.add(*reinterpret_cast<const float4*>(s + i));
  }
  for (int64_t i = vector_end + threadIdx.x; i < keys; i += kThreads) running.add(s[i]);
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xffffffffu, running.max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, running.sum, offset);
    running.merge(other_max, other_sum);
  }
  if (lane == 0) {
    partial_max[warp] = running.max;
    partial[warp] = running.sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    RunningExpSum row;
    for (int w = 0; w < DenseKlTraits::kWarps; ++w) row.merge(partial_max[w], partial[w]);
    row_lse = row.log_sum_exp();
  }
  __syncthreads();
  const float lse = row_lse;

  float total = 0.f;
  for (int64_t i = 4 * threadIdx.x; i < vector_end; i += 4 * kThreads) {
    const float4 x = *reinterpret_cast<const float4*>(s + i);
    float4& t = *reinterpret_cast<float4*>(p + i);
    const float4 target = t;
    t = make_float4(kl_term(x.x, target.x, lse, total), kl_term(x.y, target.y, lse, total),
                    kl_term(x.z, target.z, lse, total), kl_term(x.w, target.w, lse, total));
  }
  for (int64_t i = vector_end + threadIdx.x; i < keys; i += kThreads) {
    p[i] = kl_term(s[i], p[i], lse, total);
  }
  total = warp_sum(total);
  if (lane == 0) partial[warp] = total;  // thread 0 read the sums before the last barrier
  __syncthreads();
  if (threadIdx.x == 0) {
    float row_total = 0.f;
    for (int w = 0; w < DenseKlTraits::kWarps; ++w) row_total += partial[w];
    loss[blockIdx.x] = row_total;
  }
}

// ---- dense_attention_lse and dense_attention_target ---------------------------------------------

// lse[r, h], one warp per (row, head): an online log-sum-exp over the row's visible logits.
__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    dense_attention_lse_kernel(IndexerShape shape, int64_t first, int64_t rows, int64_t heads,
                               int64_t keys, const float* logits, float scale, float* lse) {
  const auto [row_head, lane] = warp_row();
  if (row_head >= rows * heads) return;
  const int64_t seen =
      PrefixKeys{shape.q_offset + first, shape.visibility.tokens_per_key, keys}.visible(row_head /
                                                                                        heads);
  const float* const x = logits + row_head * keys;
  float max_x = kNegInf, sum = 0.f;
  for (int64_t s = lane; s < seen; s += 32) {
    const float v = scale * x[s];
    if (v > max_x) {
      sum = sum * expf(max_x - v) + 1.f;  // exp(-inf) = 0 on the first key
      max_x = v;
    } else {
      sum += expf(v - max_x);
    }
  }
  const float row_max = warp_max(max_x);
  sum = max_x == kNegInf ? 0.f : sum * expf(max_x - row_max);
  sum = warp_sum(sum);
  if (lane == 0) lse[row_head] = row_max == kNegInf ? kNegInf : row_max + logf(sum);
}

// target[r, s], a thread per key of a row: the heads' probabilities summed (the row's lse in
// shared memory), divided by H. Launched with the row in blockIdx.y.
constexpr int kTargetThreads = 256;
constexpr int kMaxTargetHeads = 256;
__global__ void __launch_bounds__(kTargetThreads)
    dense_attention_target_kernel(IndexerShape shape, int64_t first, int64_t heads, int64_t keys,
                                  const float* logits, float scale, const float* lse, float* target,
                                  int64_t target_stride) {
  __shared__ float row_lse[kMaxTargetHeads];
  const int64_t r = blockIdx.y;
  for (int64_t h = threadIdx.x; h < heads; h += kTargetThreads) row_lse[h] = lse[r * heads + h];
  __syncthreads();
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kTargetThreads + threadIdx.x;
  if (s >= keys) return;
  float p = 0.f;
  const PrefixKeys prefix{shape.q_offset + first, shape.visibility.tokens_per_key, keys};
  if (s < prefix.visible(r)) {  // then every head's lse is finite
    const float* const x = logits + r * heads * keys + s;
    for (int64_t h = 0; h < heads; ++h) p += expf(scale * x[h * keys] - row_lse[h]);
    p /= static_cast<float>(heads);
  }
  target[r * target_stride + s] = p;
}

// ---- Launchers ----------------------------------------------------------------------------------

template <class Fn>
auto dispatch_indexer_shape(int64_t heads, int64_t dim, Fn&& fn) {
  auto with_dim = [&](auto heads_constant) {
    constexpr int kHeads = decltype(heads_constant)::value;
    if (dim == 128) return fn(ScoreGradTraits<kHeads, 128>{});
    if (dim == 64) return fn(ScoreGradTraits<kHeads, 64>{});
    throw std::invalid_argument(
        "hyscale::index_score_backward (CUDA): d_I must be 64 or 128, got " + std::to_string(dim));
  };
  if (heads == 64) return with_dim(std::integral_constant<int, 64>{});
  if (heads == 32) return with_dim(std::integral_constant<int, 32>{});
  if (heads == 16) return with_dim(std::integral_constant<int, 16>{});
  throw std::invalid_argument(
      "hyscale::index_score_backward (CUDA): H_I must be 16, 32 or 64, got " +
      std::to_string(heads));
}

unsigned row_warp_blocks(int64_t rows) {
  return static_cast<unsigned>(ceil_div(rows, RowWarpTraits::kRowsPerBlock));
}

// The deterministic mode's workspace: grad_k in fixed point, then the two bounds.
size_t fixed_grad_k_bytes(const IndexerShape& shape) {
  return static_cast<size_t>(shape.num_keys * shape.dim) * sizeof(unsigned long long);
}

}  // namespace

size_t index_score_backward_workspace_bytes(const IndexerShape& shape, bool deterministic) {
  return deterministic ? fixed_grad_k_bytes(shape) + 2 * sizeof(float) : 0;
}

namespace {

// index_score_backward's kernel and its passes: the gates' gradients given (grad_scores), or
// formed from the KL (kl.target set: indexer_loss_backward).
void launch_index_score_backward(const char* op, const IndexerShape& shape, const void* q,
                                 const void* k, const float* w, const int32_t* indices,
                                 int64_t topk, const float* grad_scores, LossFromTarget kl,
                                 bool deterministic, void* grad_q, bool grad_q_bf16, float* grad_k,
                                 float* grad_w, void* workspace, Stream stream) {
  const bool from_target = kl.target != nullptr;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  throw_on_error(
      cudaMemsetAsync(grad_k, 0, shape.num_keys * shape.dim * sizeof(float), cuda_stream), op,
      "zeroing grad_k");
  if (shape.num_queries == 0) return;
  const auto* q16 = static_cast<const __nv_bfloat16*>(q);
  unsigned long long* fixed_k = nullptr;
  GradKScaleOf scale_of{shape.num_queries, nullptr};
  if (deterministic) {
    fixed_k = static_cast<unsigned long long*>(workspace);
    auto* bounds = reinterpret_cast<float*>(fixed_k + shape.num_keys * shape.dim);
    scale_of.bounds = bounds;
    throw_on_error(cudaMemsetAsync(fixed_k, 0, fixed_grad_k_bytes(shape), cuda_stream), op,
                   "zeroing the fixed-point grad_k");
    throw_on_error(cudaMemsetAsync(bounds, 0, 2 * sizeof(float), cuda_stream), op,
                   "zeroing the bounds");
    absmax_kernel<<<264, 256, 0, cuda_stream>>>(q16, shape.num_queries * shape.heads * shape.dim,
                                                bounds);
    throw_on_error(cudaGetLastError(), op, "absmax_kernel launch");
    row_grad_bound_kernel<<<row_warp_blocks(shape.num_queries), RowWarpTraits::kThreads, 0,
                            cuda_stream>>>(shape.num_queries, shape.heads, topk, w, indices,
                                           grad_scores, from_target ? kl.grad_loss : nullptr,
                                           bounds + 1);
    throw_on_error(cudaGetLastError(), op, "row_grad_bound_kernel launch");
  }
  dispatch_indexer_shape(shape.heads, shape.dim, [&](auto traits) {
    using Tr = decltype(traits);
    constexpr size_t kSmem = Tr::kSmemBytes;
    auto kernel = deterministic
                      ? (from_target ? index_score_backward_kernel<Tr, KeyGrad::kFixed, true>
                                     : index_score_backward_kernel<Tr, KeyGrad::kFixed, false>)
                      : (from_target ? index_score_backward_kernel<Tr, KeyGrad::kReduce, true>
                                     : index_score_backward_kernel<Tr, KeyGrad::kReduce, false>);
    throw_on_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                   op, "shared memory size");
    TileRotation rotation{0, 0};
    if (!deterministic) {
      int device = 0, l2_bytes = 0;
      throw_on_error(cudaGetDevice(&device), op, "device");
      throw_on_error(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), op,
                     "L2 size");
      rotation.resident_rows = static_cast<int>(resident_blocks(kernel, Tr::kThreads, kSmem, op));
      // Rows whose keys' rows of k_I (bf16) and grad_k (fp32) fill half the L2.
      rotation.min_span = l2_bytes / 2 / (Tr::kDim * (2 + 4));
    }
    kernel<<<static_cast<unsigned>(shape.num_queries), Tr::kThreads, kSmem, cuda_stream>>>(
        q16, static_cast<const __nv_bfloat16*>(k), w, indices, topk, grad_scores, kl,
        QueryGrad{grad_q, grad_q_bf16}, grad_k, grad_w, fixed_k, scale_of, rotation);
    throw_on_error(cudaGetLastError(), op, "kernel launch");
  });
  if (deterministic) {
    fixed_to_float_kernel<<<1024, 256, 0, cuda_stream>>>(fixed_k, shape.num_keys * shape.dim,
                                                         scale_of, grad_k);
    throw_on_error(cudaGetLastError(), op, "fixed_to_float_kernel launch");
  }
}

}  // namespace

void index_score_backward(const IndexerShape& shape, const void* q, const void* k, const float* w,
                          const int32_t* indices, int64_t topk, const float* grad_scores,
                          bool deterministic, void* grad_q, bool grad_q_bf16, float* grad_k,
                          float* grad_w, void* workspace, Stream stream) {
  launch_index_score_backward("hyscale::index_score_backward (CUDA)", shape, q, k, w, indices, topk,
                              grad_scores, LossFromTarget{}, deterministic, grad_q, grad_q_bf16,
                              grad_k, grad_w, workspace, stream);
}

void indexer_loss_backward(const IndexerShape& shape, const void* q, const void* k, const float* w,
                           const int32_t* indices, int64_t topk, const float* target,
                           const float* score_lse, const float* grad_loss, bool deterministic,
                           float* loss, void* grad_q, bool grad_q_bf16, float* grad_k,
                           float* grad_w, void* workspace, Stream stream) {
  launch_index_score_backward("hyscale::indexer_loss_backward (CUDA)", shape, q, k, w, indices,
                              topk, nullptr, LossFromTarget{target, score_lse, grad_loss, loss},
                              deterministic, grad_q, grad_q_bf16, grad_k, grad_w, workspace,
                              stream);
}

namespace {

// The dense warm-up's kernels of a shape, with their shared memory sizes set: the rows kernel
// and the key kernel's two forms (DenseBackwardTraits).
template <class Tr>
struct DenseScoreBackwardKernels {
  using D = DenseBackwardTraits;
  static constexpr size_t kRowsSmem = D::rows_smem_bytes<Tr>();
  static constexpr size_t kShareSmem = DenseKeyGradLayout<Tr, D::kWarpgroups, 1>::kSmemBytes;
  static constexpr size_t kSplitSmem = DenseKeyGradLayout<Tr, 1, D::kWarpgroups>::kSmemBytes;
  static constexpr auto rows = dense_query_grad_kernel<Tr>;
  static constexpr auto keys_share = dense_key_grad_kernel<Tr, D::kWarpgroups, 1>;
  static constexpr auto keys_split = dense_key_grad_kernel<Tr, 1, D::kWarpgroups>;
  static void set_shared_memory(const char* op) {
    throw_on_error(
        cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, kRowsSmem), op,
        "shared memory size (rows)");
    throw_on_error(
        cudaFuncSetAttribute(keys_share, cudaFuncAttributeMaxDynamicSharedMemorySize, kShareSmem),
        op, "shared memory size (keys)");
    throw_on_error(
        cudaFuncSetAttribute(keys_split, cudaFuncAttributeMaxDynamicSharedMemorySize, kSplitSmem),
        op, "shared memory size (keys, split)");
  }
};

constexpr const char* kDenseOp = "hyscale::dense_indexer_kl (CUDA)";

int multiprocessors() {
  int device = 0, sms = 0;
  throw_on_error(cudaGetDevice(&device), kDenseOp, "current device");
  throw_on_error(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), kDenseOp,
                 "multiprocessor count");
  return sms;
}

// The rows a block of the key kernel walks, a step each of its warpgroups (every split) takes,
// ahead of the launch: the makespan of its blocks in launch order, one an SM at a time.
int64_t key_grad_makespan(const IndexerShape& shape, int64_t tiles_per_block, int64_t splits,
                          int sms) {
  std::vector<int64_t> free_at(static_cast<size_t>(sms), 0);
  int64_t makespan = 0;
  for (int64_t key = 0; key < shape.num_keys; key += 64 * tiles_per_block) {
    // first_row_seeing (PrefixKeys) on the host.
    const int64_t first =
        std::max<int64_t>(0, (key + 1) * shape.visibility.tokens_per_key - 1 - shape.q_offset);
    if (first >= shape.num_queries) continue;
    std::pop_heap(free_at.begin(), free_at.end(), std::greater<>());
    free_at.back() += ceil_div(shape.num_queries - first, splits);
    makespan = std::max(makespan, free_at.back());
    std::push_heap(free_at.begin(), free_at.end(), std::greater<>());
  }
  return makespan;
}

// Whether a block of rows takes the key kernel whose row serves three tiles (a third of the L2
// reads) over the one that splits a tile's rows three ways (three times the blocks): where its
// makespan, in steps, is no longer. HYSCALE_DENSE_KEY_GRAD=share (split) forces one: tests, A/B.
bool dense_key_grad_shares_queries(const IndexerShape& shape, int sms) {
  if (const char* forced = std::getenv("HYSCALE_DENSE_KEY_GRAD")) {
    if (std::string(forced) == "share") return true;
    if (std::string(forced) == "split") return false;
  }
  constexpr int kWays = DenseBackwardTraits::kWarpgroups;
  return key_grad_makespan(shape, kWays, 1, sms) <= key_grad_makespan(shape, 1, kWays, sms);
}

}  // namespace

int64_t dense_index_score_backward_rows_per_wave(int64_t heads, int64_t dim) {
  return dispatch_indexer_shape(heads, dim, [&](auto traits) -> int64_t {
    using Kernels = DenseScoreBackwardKernels<decltype(traits)>;
    Kernels::set_shared_memory(kDenseOp);
    int resident = 0;
    throw_on_error(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                       &resident, Kernels::rows, DenseBackwardTraits::kThreads, Kernels::kRowsSmem),
                   kDenseOp, "occupancy");
    return std::max<int64_t>(1, int64_t(multiprocessors()) * resident) *
           DenseBackwardTraits::kRowsPerBlock<decltype(traits)>;
  });
}

void dense_index_score_backward(const IndexerShape& shape, const void* q, const void* k,
                                const float* w, const float* grad_scores, const uint64_t* gates,
                                int64_t table_stride, float* grad_q, float* grad_k, float* grad_w,
                                Stream stream) {
  if (shape.num_queries == 0 || shape.num_keys == 0) return;
  if (table_stride < shape.num_keys || table_stride % 4 != 0) {
    throw std::invalid_argument(std::string(kDenseOp) + ": table_stride " +
                                std::to_string(table_stride) +
                                " must be a multiple of 4 of at least " +
                                std::to_string(shape.num_keys) + " keys (16-byte rows)");
  }
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const auto* q16 = static_cast<const __nv_bfloat16*>(q);
  const auto* k16 = static_cast<const __nv_bfloat16*>(k);
  const int64_t rows = shape.num_queries, keys = shape.num_keys;
  const PrefixKeys prefix{shape.q_offset, shape.visibility.tokens_per_key, keys};
  const bool share = dense_key_grad_shares_queries(shape, multiprocessors());
  dispatch_indexer_shape(shape.heads, shape.dim, [&](auto traits) {
    using Tr = decltype(traits);
    using Kernels = DenseScoreBackwardKernels<Tr>;
    using D = DenseBackwardTraits;
    Kernels::set_shared_memory(kDenseOp);
    // The [rows, keys] tables as the TMA unit's boxes: a block's rows x a key tile (rows kernel),
    // a step's rows x a block's keys (key kernel).
    auto tables = [&](int box_keys, int box_rows) {
      return std::pair{
          table_tile_map(grad_scores, 4, rows, keys, table_stride, box_keys, box_rows, kDenseOp),
          table_tile_map(gates, 8, rows, keys, table_stride, box_keys, box_rows, kDenseOp)};
    };
    const CUtensorMap key_map = bf16_tile_map(k16, keys, Tr::kDim, Tr::kKeys, kDenseOp);
    const CUtensorMap query_map =
        bf16_tile_map(q16, rows * Tr::kHeads, Tr::kDim, Tr::kHeads, kDenseOp);
    const auto [row_grads, row_gates] = tables(Tr::kKeys, D::kRowsPerBlock<Tr>);
    const auto rows_kernel = Kernels::rows;
    rows_kernel<<<static_cast<unsigned>(ceil_div(rows, D::kRowsPerBlock<Tr>)), D::kThreads,
                  Kernels::kRowsSmem, cuda_stream>>>(q16, key_map, row_grads, row_gates, w, prefix,
                                                     rows, grad_q, grad_w);
    throw_on_error(cudaGetLastError(), kDenseOp, "rows kernel launch");
    const int64_t tiles = ceil_div(keys, Tr::kKeys);
    const int tiles_a_block = share ? D::kWarpgroups : 1, splits = share ? 1 : D::kWarpgroups;
    const auto [key_grads, key_gates] = tables(tiles_a_block * Tr::kKeys, splits);
    const CUtensorMap weight_map =
        table_tile_map(w, 4, rows, Tr::kHeads, Tr::kHeads, Tr::kHeads, splits, kDenseOp);
    if (share) {
      Kernels::keys_share<<<static_cast<unsigned>(ceil_div(tiles, D::kWarpgroups)), D::kThreads,
                            Kernels::kShareSmem, cuda_stream>>>(query_map, key_grads, key_gates,
                                                                weight_map, prefix, rows, grad_k);
    } else {
      Kernels::keys_split<<<static_cast<unsigned>(tiles), D::kThreads, Kernels::kSplitSmem,
                            cuda_stream>>>(query_map, key_grads, key_gates, weight_map, prefix,
                                           rows, grad_k);
    }
    throw_on_error(cudaGetLastError(), kDenseOp, "keys kernel launch");
  });
}

void dense_indexer_kl_rows(int64_t rows, int64_t keys, const float* score, int64_t score_stride,
                           float* target_grad, int64_t target_stride, float* loss, Stream stream) {
  if (rows == 0) return;
  dense_indexer_kl_rows_kernel<<<static_cast<unsigned>(rows), DenseKlTraits::kThreads, 0,
                                 static_cast<cudaStream_t>(stream)>>>(
      keys, score, score_stride, target_grad, target_stride, loss);
  throw_on_error(cudaGetLastError(), "hyscale::dense_indexer_kl (CUDA)",
                 "dense_indexer_kl_rows_kernel launch");
}

void dense_attention_lse(const IndexerShape& shape, int64_t first, int64_t rows, int64_t heads,
                         int64_t keys, const float* logits, float scale, float* lse,
                         Stream stream) {
  if (rows == 0) return;
  dense_attention_lse_kernel<<<row_warp_blocks(rows * heads), RowWarpTraits::kThreads, 0,
                               static_cast<cudaStream_t>(stream)>>>(shape, first, rows, heads, keys,
                                                                    logits, scale, lse);
  throw_on_error(cudaGetLastError(), "hyscale::dense_indexer_kl (CUDA)",
                 "dense_attention_lse_kernel launch");
}

void dense_attention_target(const IndexerShape& shape, int64_t first, int64_t rows, int64_t heads,
                            int64_t keys, const float* logits, float scale, const float* lse,
                            float* target, int64_t target_stride, Stream stream) {
  const char* op = "hyscale::dense_indexer_kl (CUDA)";
  if (heads > kMaxTargetHeads) {
    throw std::invalid_argument(std::string(op) + ": H must be at most " +
                                std::to_string(kMaxTargetHeads) + ", got " + std::to_string(heads));
  }
  if (rows == 0 || keys == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(keys, kTargetThreads)),
                  static_cast<unsigned>(rows));
  dense_attention_target_kernel<<<grid, kTargetThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      shape, first, heads, keys, logits, scale, lse, target, target_stride);
  throw_on_error(cudaGetLastError(), op, "dense_attention_target_kernel launch");
}

void indexer_kl_fwd(int64_t rows, int64_t topk, const float* score, const float* target,
                    float* loss, Stream stream) {
  if (rows == 0) return;
  indexer_kl_fwd_kernel<<<row_warp_blocks(rows), RowWarpTraits::kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(rows, topk, score, target, loss);
  throw_on_error(cudaGetLastError(), "hyscale::indexer_kl (CUDA)", "kernel launch");
}

void indexer_kl_bwd(int64_t rows, int64_t topk, const float* score, const float* target,
                    const float* grad_loss, float* grad_score, Stream stream) {
  if (rows == 0) return;
  indexer_kl_bwd_kernel<<<row_warp_blocks(rows), RowWarpTraits::kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(rows, topk, score, target, grad_loss,
                                                               grad_score);
  throw_on_error(cudaGetLastError(), "hyscale::indexer_kl_backward (CUDA)", "kernel launch");
}

}  // namespace hyscale::cuda
