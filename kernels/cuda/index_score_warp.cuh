// Warp-level lightning-indexer scoring on tensor cores: the one routine behind flash_topk,
// index_score_gather and the score-table baseline, so all three produce bit-identical scores.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/index_tile_traits.cuh"

namespace hyscale::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte global -> shared copy that bypasses registers; `valid` false writes zeros instead.
__device__ __forceinline__ void cp_async_16(void* smem, const void* global, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies `rows` rows of `Traits::kDim` bf16 from global (row stride kDim) into a padded shared
// tile (row stride kRowStride), `lanes` threads cooperating starting at `lane`. Row r comes from
// `row_pointer(r)`; a null pointer zero-fills the row.
template <class Traits, class RowPointer>
__device__ __forceinline__ void load_rows_async(__nv_bfloat16* tile, int rows, int lane, int lanes,
                                                RowPointer row_pointer) {
  constexpr int kChunksPerRow = Traits::kDim * 2 / 16;
  for (int i = lane; i < rows * kChunksPerRow; i += lanes) {
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const __nv_bfloat16* src = row_pointer(row);
    cp_async_16(tile + row * Traits::kRowStride + chunk * 8, src ? src + chunk * 8 : tile,
                src != nullptr);
  }
}

// The head weights a lane needs: heads 8*nt + 2*(lane%4) + {0,1} for every n8 tile nt.
template <class Traits>
__device__ __forceinline__ void load_lane_weights(const float* w_row, int lane,
                                                  float (&weights)[Traits::kHeadsPerLane]) {
#pragma unroll
  for (int nt = 0; nt < Traits::kNTiles; ++nt) {
    const float2 pair = *reinterpret_cast<const float2*>(w_row + nt * 8 + 2 * (lane % 4));
    weights[2 * nt] = pair.x;
    weights[2 * nt + 1] = pair.y;
  }
}

// One query's operand of the scoring product, held in registers for a whole key loop: the mma B
// fragments of Q^T [d x heads]. Lane L holds q[8*nt + L/4][16*ks + 2*(L%4) + {0,1}] in b[ks][nt][0]
// and the same 8 dims further in b[ks][nt][1].
template <class Traits>
struct QueryFragments {
  uint32_t b[Traits::kKSteps][Traits::kNTiles][2];
};

// Loads the fragments of `q_row` ([heads][dim] bf16 in global memory); null gives zeros.
template <class Traits>
__device__ __forceinline__ void load_query_fragments(const __nv_bfloat16* q_row, int lane,
                                                     QueryFragments<Traits>& f) {
  const int group = lane / 4, pair = 2 * (lane % 4);
#pragma unroll
  for (int ks = 0; ks < Traits::kKSteps; ++ks) {
#pragma unroll
    for (int nt = 0; nt < Traits::kNTiles; ++nt) {
      const __nv_bfloat16* at = q_row + (nt * 8 + group) * Traits::kDim + ks * 16 + pair;
      f.b[ks][nt][0] = q_row ? *reinterpret_cast<const uint32_t*>(at) : 0u;
      f.b[ks][nt][1] = q_row ? *reinterpret_cast<const uint32_t*>(at + 8) : 0u;
    }
  }
}

// Scores of the kKeysPerTile keys of `key_tile` (a padded shared tile) for the query whose
// fragments are `query`: score[s] = sum_h w[h] * ReLU(q[h] . k[s]). Lane L returns the scores of
// tile keys 16*(L%4) + L/4 (.x) and 16*(L%4) + L/4 + 8 (.y).
// One m16 tile of keys at a time: its head-weighted epilogue overlaps the next tile's products,
// and 32 accumulators per lane leave room for the query in registers.
template <class Traits>
__device__ __forceinline__ float2 score_key_tile(const __nv_bfloat16* key_tile,
                                                 const QueryFragments<Traits>& query, int lane,
                                                 const float (&weights)[Traits::kHeadsPerLane]) {
  static_assert(Traits::kMTiles == 4, "a quad's four lanes keep one m16 tile each");
  float2 out = make_float2(0.f, 0.f);
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
    float acc[Traits::kNTiles][4] = {};
#pragma unroll
    for (int ks = 0; ks < Traits::kKSteps; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(
          a, key_tile + (mt * 16 + lane % 16) * Traits::kRowStride + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nt = 0; nt < Traits::kNTiles; ++nt) {
        mma_bf16_16816(acc[nt], a, query.b[ks][nt][0], query.b[ks][nt][1]);
      }
    }
    // ReLU and head weights over this lane's heads, for its rows g and g+8 of the m16 tile...
    float lo = 0.f, hi = 0.f;
#pragma unroll
    for (int nt = 0; nt < Traits::kNTiles; ++nt) {
      lo = __fmaf_rn(weights[2 * nt], fmaxf(acc[nt][0], 0.f), lo);
      lo = __fmaf_rn(weights[2 * nt + 1], fmaxf(acc[nt][1], 0.f), lo);
      hi = __fmaf_rn(weights[2 * nt], fmaxf(acc[nt][2], 0.f), hi);
      hi = __fmaf_rn(weights[2 * nt + 1], fmaxf(acc[nt][3], 0.f), hi);
    }
    // ...then over the quad's four lanes, which hold the other heads of the same rows. The
    // butterfly gives every lane of the quad the same bits (fp addition is commutative).
    lo += __shfl_xor_sync(0xffffffffu, lo, 1);
    lo += __shfl_xor_sync(0xffffffffu, lo, 2);
    hi += __shfl_xor_sync(0xffffffffu, hi, 1);
    hi += __shfl_xor_sync(0xffffffffu, hi, 2);
    if (lane % 4 == mt) out = make_float2(lo, hi);
  }
  return out;
}

// Tile-relative key of the .x score a lane gets from score_key_tile (.y is 8 further).
__device__ __forceinline__ int lane_key(int lane) {
  return 16 * (lane % 4) + lane / 4;
}

}  // namespace hyscale::cuda
