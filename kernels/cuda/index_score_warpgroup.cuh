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

// Shared memory written through the generic proxy (cp.async, stores) becomes visible to wgmma
// (the async proxy) only after this fence in each writing thread, then a barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Tiles use wgmma's 128-byte swizzle, K-major: a tile of kRows rows is kDim/64 column blocks of
// [kRows x 128 bytes] (64 dims each), and the 16-byte chunk c of row r sits at chunk position
// c ^ (r % 8) of its 128-byte row. Without the swizzle, 8-row groups lie a multiple of 1 KB apart
// and the tensor cores' reads of them fall into the same banks. Tiles and their column blocks
// start 1 KB-aligned (the swizzle pattern follows address bits 4-9).
template <class Traits, int kRows>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(kRows % 8 == 0, "tiles hold whole 8-row groups");
  return (chunk / 8) * (kRows * 64) + row * 64 + ((chunk % 8) ^ (row % 8)) * 8;
}

// Copies rows [first_row, first_row + rows) of a kRows-row tile (row first_row + r from
// row_pointer(r); null zero-fills), `threads` threads cooperating starting at `thread`.
template <class Traits, int kRows, class RowPointer>
__device__ __forceinline__ void load_rows_async(__nv_bfloat16* tile, int first_row, int rows,
                                                int thread, int threads, RowPointer row_pointer) {
  constexpr int kChunksPerRow = Traits::kDim / 8;
  for (int i = thread; i < rows * kChunksPerRow; i += threads) {
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const __nv_bfloat16* src = row_pointer(row);
    cp_async_16(tile + swizzled_offset<Traits, kRows>(first_row + row, chunk),
                src ? src + chunk * 8 : tile, src != nullptr);
  }
}

// wgmma matrix descriptor of k16 step `ks` of the rows from `first_row` (a multiple of 8) of a
// kRows-row swizzled tile: 128B swizzle mode, 1 KB between 8-row groups; along d the start
// address moves 32 bytes a step inside a 128-byte column block (the hardware applies the swizzle
// to the final address), then to the next column block.
template <class Traits, int kRows>
__device__ __forceinline__ uint64_t matrix_descriptor(const __nv_bfloat16* tile, int first_row,
                                                      int ks) {
  const __nv_bfloat16* start = tile + (ks / 4) * (kRows * 64) + first_row * 64 + (ks % 4) * 16;
  constexpr uint64_t kLeadingBytes = 16;  // unused by swizzled K-major layouts
  constexpr uint64_t kStrideBytes = 1024;
  constexpr uint64_t kSwizzle128B = uint64_t(1) << 62;
  return static_cast<uint64_t>((smem_address(start) & 0x3ffff) >> 4) |
         ((kLeadingBytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) | kSwizzle128B;
}

// wgmma exists on sm_90a only. The sm_90 (no "a") build that CMake also makes, for tools that
// want it, compiles these to a trap; a Hopper GPU runs the sm_90a code.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HYSCALE_WGMMA(...) asm volatile(__VA_ARGS__)
#else
#define HYSCALE_WGMMA(...) __trap()
#endif

__device__ __forceinline__ void wgmma_fence() {
  HYSCALE_WGMMA("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  HYSCALE_WGMMA("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  HYSCALE_WGMMA("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins accumulator registers at this point of the program: the compiler may not move reads or
// writes of them across it, so reads of one wgmma group's accumulators stay after the wait that
// retires it while another group runs (ptxas would otherwise serialize the wgmmas).
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&acc)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// D (+)= A * B^T for m64 n{16,32,64,128} k16, bf16 in, fp32 accumulate, A and B K-major in
// shared memory. `accumulate` false overwrites D. N is queries x H_I: one query (the gather
// kernel) or two (a half of the selection kernel's four).
template <int kN>
struct Wgmma;

// Specializations per N (generated: one output operand per accumulator register).
template <>
struct Wgmma<16> {
  static __device__ __forceinline__ void run(float (&d)[8], uint64_t a, uint64_t b, int acc) {
    HYSCALE_WGMMA(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(a), "l"(b), "r"(acc));
  }
};

template <>
struct Wgmma<32> {
  static __device__ __forceinline__ void run(float (&d)[16], uint64_t a, uint64_t b, int acc) {
    HYSCALE_WGMMA(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17"
        ", p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(acc));
  }
};

template <>
struct Wgmma<64> {
  static __device__ __forceinline__ void run(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    HYSCALE_WGMMA(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17,"
        " %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33"
        ", p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(acc));
  }
};

template <>
struct Wgmma<128> {
  static __device__ __forceinline__ void run(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    HYSCALE_WGMMA(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17,"
        " %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33,"
        " %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49,"
        " %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65"
        ", p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(a), "l"(b), "r"(acc));
  }
};

// Issues (does not wait for) the products of a 64-key tile with kQueries queries: rows
// first_row.. of a kQueryRows-row query tile, one query's H_I head rows after another (N =
// kQueries * H_I). Accumulators: the n8 column group j of query q is acc[4 * (q * kNTiles + j)
// ...]. Callers fence before (wgmma_fence) and commit after (wgmma_commit).
template <class Traits, int kQueries, int kQueryRows>
__device__ __forceinline__ void issue_key_tile(const __nv_bfloat16* key_tile,
                                               const __nv_bfloat16* queries, int first_row,
                                               float (&acc)[kQueries * Traits::kHeads / 2]) {
#pragma unroll
  for (int ks = 0; ks < Traits::kKSteps; ++ks) {
    Wgmma<kQueries * Traits::kHeads>::run(
        acc, matrix_descriptor<Traits, Traits::kKeysPerTile>(key_tile, 0, ks),
        matrix_descriptor<Traits, kQueryRows>(queries, first_row, ks), ks > 0);
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

// The tile key whose score lane `lane` of warp `warp` (of its warpgroup) emits: lanes with
// lane%4 == 0 emit .x, lane%4 == 1 emit .y, the other two lanes emit nothing (-1).
__device__ __forceinline__ int emitted_key(int warp, int lane) {
  const int quad_lane = lane % 4;
  return quad_lane < 2 ? 16 * warp + lane / 4 + 8 * quad_lane : -1;
}

}  // namespace hyscale::cuda
