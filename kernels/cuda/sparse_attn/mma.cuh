// Warp-level tensor-core helpers of the sparse attention kernels (sm_80+ instructions, run on
// sm_90a): ldmatrix from XOR-swizzled shared memory and mma.sync m16n8k16 bf16 -> fp32.
//
// Tiles are row-major [rows][D] bf16 with D a multiple of 32; 16-byte chunk c of row r lives at
// chunk c ^ swizzle(r), so the 8 rows an ldmatrix phase reads hit 8 different bank groups.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda::attn {

// Element offset of (row, col) in a swizzled [rows][kCols] tile (col a multiple of 8 for chunks).
template <int kCols>
__device__ __forceinline__ int swz(int row, int col) {
  constexpr int kChunks = kCols / 8;
  static_assert(kChunks >= 4, "tiles are at least 32 columns wide");
  const int chunk = col >> 3;
  const int x = kChunks >= 8 ? (row & 7) : ((row >> 1) & 3);
  return row * kCols + (((chunk ^ x) << 3) | (col & 7));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment (16 x 16) at (row0, col0) of a row-major tile: rows are M, columns are K.
template <int kCols>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int row0,
                                       int col0, int lane) {
  ldsm_x4(a, tile + swz<kCols>(row0 + (lane & 15), col0 + ((lane >> 4) << 3)));
}
// A fragment (16 x 16) of the transpose of a row-major tile: M runs along the tile's columns
// (from col0), K along its rows (from row0).
template <int kCols>
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4], const __nv_bfloat16* tile, int row0,
                                         int col0, int lane) {
  ldsm_x4_t(a, tile + swz<kCols>(row0 + (lane & 7) + ((lane >> 4) << 3),
                                 col0 + (((lane >> 3) & 1) << 3)));
}
// B fragments of two n8 tiles (n0..n0+15), K = 16 from k0, where the tile stores B^T row-major
// ([n][k], e.g. keys x dims for Q K^T): b[0..1] for n0, b[2..3] for n0 + 8.
template <int kCols>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const __nv_bfloat16* tile, int n0,
                                          int k0, int lane) {
  ldsm_x4(b,
          tile + swz<kCols>(n0 + (lane & 7) + ((lane >> 4) << 3), k0 + (((lane >> 3) & 1) << 3)));
}
// The same where the tile stores B row-major ([k][n], e.g. keys x dims for P V).
template <int kCols>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const __nv_bfloat16* tile, int k0,
                                          int n0, int lane) {
  ldsm_x4_t(b,
            tile + swz<kCols>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), n0 + ((lane >> 4) << 3)));
}

// The same from a tile in wgmma's 128-byte-swizzled layout (wgmma.cuh) of kRows rows.
template <int kRows>
__device__ __forceinline__ void load_b_kn_wgmma_tile(uint32_t (&b)[4], const __nv_bfloat16* tile,
                                                     int k0, int n0, int lane) {
  const int row = k0 + (lane & 7) + (((lane >> 3) & 1) << 3), col = n0 + ((lane >> 4) << 3);
  ldsm_x4_t(b, tile + swizzled_offset<kRows>(row, col / 8));
}

// acc[0], acc[1] += A[row0 .. row0+16, 0 .. kK) x B[0 .. kK, n0 .. n0+8), [.., n0+8 .. n0+16), with
// A a row-major [.][kK] tile (queries or dO) and B^T a row-major [.][kK] tile (keys or values):
// the backward's S = Q K^T and dP = dO V^T on a warp's 16 x 16 block.
template <int kK>
__device__ __forceinline__ void mma_block_by_nk(float (&acc)[2][4], const __nv_bfloat16* a_tile,
                                                int row0, const __nv_bfloat16* b_tile, int n0,
                                                int lane) {
#pragma unroll 4
  for (int k0 = 0; k0 < kK; k0 += 16) {
    uint32_t a[4], b[4];
    load_a<kK>(a, a_tile, row0, k0, lane);
    load_b_nk<kK>(b, b_tile, n0, k0, lane);
    mma_bf16(acc[0], a, b[0], b[1]);
    mma_bf16(acc[1], a, b[2], b[3]);
  }
}

// acc[nt] += A[row0 .. row0+16, 0 .. kK) x B[0 .. kK, n0 + 8 nt .. + 8) for nt < kTiles, with A a
// row-major [.][kK] tile (probabilities or dS) and B a row-major [kK][kBCols] tile (values or
// keys): the P V product of the forward and the dS K product of dq.
template <int kK, int kBCols, int kTiles>
__device__ __forceinline__ void mma_rows_by_kn(float (&acc)[kTiles][4], const __nv_bfloat16* a_tile,
                                               int row0, const __nv_bfloat16* b_tile, int n0,
                                               int lane) {
#pragma unroll
  for (int kk = 0; kk < kK; kk += 16) {
    uint32_t a[4];
    load_a<kK>(a, a_tile, row0, kk, lane);
#pragma unroll
    for (int nt = 0; nt < kTiles; nt += 2) {
      uint32_t b[4];
      load_b_kn<kBCols>(b, b_tile, kk, n0 + nt * 8, lane);
      mma_bf16(acc[nt], a, b[0], b[1]);
      mma_bf16(acc[nt + 1], a, b[2], b[3]);
    }
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Vector fp32 reduction into global memory (sm_90), its lines kept in L2 over evict-normal ones:
// the gradient rows take the reductions of every query that selected them (2.6 % faster latent
// backward at 128K with random selections, docs/performance.md section 7).
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
  asm volatile("red.global.add.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(p), "f"(a),
               "f"(b), "l"(l2_evict_last_policy())
               : "memory");
}

}  // namespace hyscale::cuda::attn
