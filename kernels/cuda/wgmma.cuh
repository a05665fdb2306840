// Hopper building blocks shared by the wgmma kernels (sm_90a): cp.async copies into
// 128-byte-swizzled tiles, wgmma matrix descriptors (K-major and MN-major) and the
// wgmma.mma_async wrappers with their fences.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace hyscale::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// The first 1024-byte-aligned place (the 128-byte swizzle's) in the dynamic shared memory that
// starts at `smem`, reached by an offset from it: the compiler then knows the pointer is shared,
// so its reads are LDS on 32-bit addresses. (Rounding the pointer as an integer would make them
// generic loads, each computing the window's 64-bit address again.)
template <class T>
__device__ __forceinline__ T* first_aligned_shared(unsigned char* smem) {
  return reinterpret_cast<T*>(smem + (1024 - smem_address(smem) % 1024) % 1024);
}

// 16-byte global -> shared copy that bypasses registers; `valid` false writes zeros instead.
__device__ __forceinline__ void cp_async_16(void* smem, const void* global, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(src_bytes));
}
// 4-byte global -> shared copy (cp.async.ca: 4 bytes take no other); `valid` false writes zeros.
__device__ __forceinline__ void cp_async_4(void* smem, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(valid ? 4 : 0));
}
// 8-byte global -> shared copy (cp.async.ca); `valid` false writes zeros.
__device__ __forceinline__ void cp_async_8(void* smem, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(valid ? 8 : 0));
}
// An L2 policy that keeps lines over evict-normal ones: rows that other blocks read or add to
// again (gathered keys, gradient rows).
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// An L2 policy that gives lines up first: rows read once (a block's Q).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async_16 under an L2 policy, fetching the surrounding 256 bytes into L2 (a gathered row is
// read in several 16-byte pieces by neighbouring threads).
__device__ __forceinline__ void cp_async_16_l2(void* smem, const void* global, bool valid,
                                               uint64_t policy) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(
                   smem_address(smem)),
               "l"(global), "r"(src_bytes), "l"(policy));
}
// Brings the line holding `address` into the SM's L1 (and L2) ahead of a load: no register, no
// wait.
__device__ __forceinline__ void prefetch_l1(const void* address) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(address));
}
// Stores four 8 x 8 bf16 matrices, register i of each thread holding matrix i's pair of columns
// 2 (lane % 4) .. of row lane / 4 (the mma accumulator layout); lanes 8 i .. 8 i + 7 give the
// shared addresses of matrix i's rows (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(void* row, const uint32_t (&regs)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(row)),
      "r"(regs[0]), "r"(regs[1]), "r"(regs[2]), "r"(regs[3])
      : "memory");
}
// stmatrix_x4 storing each 8 x 8 matrix transposed: the thread's pair (row lane / 4, columns
// 2 (lane % 4) ..) lands in rows 2 (lane % 4) .. of the 16-byte row at column lane / 4, so a
// [keys x heads] accumulator becomes a [heads x keys] tile.
__device__ __forceinline__ void stmatrix_x4_trans(void* row, const uint32_t (&regs)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   smem_address(row)),
               "r"(regs[0]), "r"(regs[1]), "r"(regs[2]), "r"(regs[3])
               : "memory");
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

// Bulk reductions (TMA): adds `bytes` (a multiple of 16) of fp32 from shared memory into global
// memory, in L2, as one asynchronous operation of this thread's bulk group; the shared source
// must be fenced to the async proxy after it was written. Whole row pieces reach the L2 rather
// than a warp's 32-byte sectors: 1.1-1.6x the throughput of red.v2 into gathered rows
// (bench/reduction_probe.cu, docs/performance.md section 7).
__device__ __forceinline__ void bulk_reduce_add(float* dst, const float* src, int bytes,
                                                uint64_t l2_policy) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, "
      "%3;\n" ::"l"(dst),
      "r"(smem_address(src)), "r"(bytes), "l"(l2_policy)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk groups but the newest kPending have read their shared-memory sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// ... and have completed (their writes are done).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Tiles use wgmma's 128-byte swizzle, K-major: a tile of kRows rows is kDim/64 column blocks of
// [kRows x 128 bytes] (64 dims each), and the 16-byte chunk c of row r sits at chunk position
// c ^ (r % 8) of its 128-byte row. Without the swizzle, 8-row groups lie a multiple of 1 KB apart
// and the tensor cores' reads of them fall into the same banks. Tiles and their column blocks
// start 1 KB-aligned (the swizzle pattern follows address bits 4-9).
template <int kRows>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(kRows % 8 == 0, "tiles hold whole 8-row groups");
  return (chunk / 8) * (kRows * 64) + row * 64 + ((chunk % 8) ^ (row % 8)) * 8;
}

// Copies rows [first_row, first_row + rows) of a kRows-row tile (row first_row + r from
// row_pointer(r); null zero-fills), `threads` threads cooperating starting at `thread`.
template <int kDim, int kRows, class RowPointer>
__device__ __forceinline__ void load_rows_async(__nv_bfloat16* tile, int first_row, int rows,
                                                int thread, int threads, RowPointer row_pointer) {
  constexpr int kChunksPerRow = kDim / 8;
  for (int i = thread; i < rows * kChunksPerRow; i += threads) {
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const __nv_bfloat16* src = row_pointer(row);
    cp_async_16(tile + swizzled_offset<kRows>(first_row + row, chunk), src ? src + chunk * 8 : tile,
                src != nullptr);
  }
}

// wgmma matrix descriptor of k16 step `ks` of the rows from `first_row` (a multiple of 8) of a
// kRows-row swizzled tile: 128B swizzle mode, 1 KB between 8-row groups; along d the start
// address moves 32 bytes a step inside a 128-byte column block (the hardware applies the swizzle
// to the final address), then to the next column block.
template <int kRows>
__device__ __forceinline__ uint64_t matrix_descriptor(const __nv_bfloat16* tile, int first_row,
                                                      int ks) {
  const __nv_bfloat16* start = tile + (ks / 4) * (kRows * 64) + first_row * 64 + (ks % 4) * 16;
  constexpr uint64_t kLeadingBytes = 16;  // unused by swizzled K-major layouts
  constexpr uint64_t kStrideBytes = 1024;
  constexpr uint64_t kSwizzle128B = uint64_t(1) << 62;
  return static_cast<uint64_t>((smem_address(start) & 0x3ffff) >> 4) |
         ((kLeadingBytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) | kSwizzle128B;
}

// matrix_descriptor(tile, first_row, ks) from matrix_descriptor(tile, first_row, 0): the start
// address field (bytes / 16) moves by the step's offset. Shared addresses fit the 14-bit field,
// so no carry leaves it; this saves recomputing the whole descriptor for every k-step.
template <int kRows>
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t first_step, int ks) {
  return first_step + (((ks / 4) * kRows * 128 + (ks % 4) * 32) >> 4);
}

// A descriptor the compiler must compute where it is used: without this, loop-invariant
// descriptors of every k-step get hoisted out of a kernel's main loop and held in registers (two
// per step), which spills in kernels whose accumulators already fill the register file.
__device__ __forceinline__ uint64_t descriptor_here(uint64_t descriptor) {
  asm volatile("" : "+l"(descriptor));
  return descriptor;
}

// The same tile read as an MN-major operand (wgmma's transposed B): the product's N runs along
// the tile's columns (d, from column first_col, a multiple of 64) and its K along the rows (from
// first_row, a multiple of 8). Canonical 128-byte-swizzled MN-major layout: 64 contiguous N
// elements per row, 8-row groups 1 KB apart (SBO) and column blocks kRows * 128 bytes apart
// (LBO), which is exactly how the K-major tile above lies in memory.
template <int kRows>
__device__ __forceinline__ uint64_t mn_major_descriptor(const __nv_bfloat16* tile, int first_col,
                                                        int first_row) {
  // first_col % 64 == 32 starts 64 bytes into the rows (an n32 operand over a block's second
  // half): the hardware applies the swizzle to the final address.
  const __nv_bfloat16* start =
      tile + (first_col / 64) * (kRows * 64) + first_row * 64 + first_col % 64;
  constexpr uint64_t kLeadingBytes = kRows * 128;  // next 64 columns
  constexpr uint64_t kStrideBytes = 1024;          // next 8 rows
  constexpr uint64_t kSwizzle128B = uint64_t(1) << 62;
  return static_cast<uint64_t>((smem_address(start) & 0x3ffff) >> 4) |
         ((kLeadingBytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) | kSwizzle128B;
}

// mn_major_descriptor(tile, first_col + cols, first_row + rows) from mn_major_descriptor(tile,
// first_col, first_row), as advance_descriptor does for K-major steps.
template <int kRows>
__device__ __forceinline__ uint64_t advance_mn_major(uint64_t first, int cols, int rows) {
  return first + (((cols / 64) * kRows * 128 + rows * 128) >> 4);
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
// The same for register A operands: a wgmma reads them after it is issued, so they stay
// untouched (and allocated) until the wait that retires it.
template <int kCount>
__device__ __forceinline__ void fence_operands(uint32_t (&a)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// D (+)= A * B^T for m64 n{16,32,64,128}, fp32 accumulate, both operands in shared memory:
// bf16 (k16; B K-major with kTransposeB = 0 or MN-major with 1, where B's rows are K, e.g. the
// values of an attention P V product read from a [keys x d] tile; A likewise with kTransposeA,
// e.g. dS^T of a key gradient read from a [rows x keys] tile) or fp8 e4m3 (k32; both K-major,
// the only layout wgmma takes for 8-bit types). A k-step covers 32 bytes of K in
// both, so the descriptors above serve both. `accumulate` false overwrites D.
// Accumulators: row 16 * warp + lane / 4 (+ 8 for the odd pair), column 8 * j + 2 * (lane % 4)
// (+ 1) in acc[4 * j ...], as mma.sync's C fragments per n8 tile.
template <int kN, int kTransposeB = 0, class Element = __nv_bfloat16, int kTransposeA = 0>
struct Wgmma;

// The accumulator operands per N: the registers in the instruction text and the outputs.
#define HYSCALE_WGMMA_N16_REGS "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define HYSCALE_WGMMA_N16_OUTS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define HYSCALE_WGMMA_N32_REGS \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define HYSCALE_WGMMA_N32_OUTS                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
#define HYSCALE_WGMMA_N64_REGS                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define HYSCALE_WGMMA_N64_OUTS                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define HYSCALE_WGMMA_N128_REGS                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define HYSCALE_WGMMA_N128_OUTS                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// The bf16 and fp8 specializations of one N; A, B, FLAG, TRANS_A and TRANS_B name the operands
// after the accumulators.
#define HYSCALE_DEFINE_WGMMA(N, A, B, FLAG, TRANS_A, TRANS_B)                                      \
  template <int kTransposeB, int kTransposeA>                                                      \
  struct Wgmma<N, kTransposeB, __nv_bfloat16, kTransposeA> {                                       \
    static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t a, uint64_t b,          \
                                               int acc) {                                          \
      HYSCALE_WGMMA("{\n.reg .pred p;\nsetp.ne.b32 p, " FLAG                                       \
                    ", 0;\n"                                                                       \
                    "wgmma.mma_async.sync.aligned.m64n" #N                                         \
                    "k16.f32.bf16.bf16 " HYSCALE_WGMMA_N##N##_REGS                                 \
                    ", " A ", " B ", p, 1, 1, " TRANS_A ", " TRANS_B ";\n}\n"                      \
                    : HYSCALE_WGMMA_N##N##_OUTS                                                    \
                    : "l"(a), "l"(b), "r"(acc), "n"(kTransposeA), "n"(kTransposeB));               \
    }                                                                                              \
  };                                                                                               \
  template <>                                                                                      \
  struct Wgmma<N, 0, __nv_fp8_e4m3, 0> {                                                           \
    static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t a, uint64_t b,          \
                                               int acc) {                                          \
      HYSCALE_WGMMA("{\n.reg .pred p;\nsetp.ne.b32 p, " FLAG                                       \
                    ", 0;\n"                                                                       \
                    "wgmma.mma_async.sync.aligned.m64n" #N                                         \
                    "k32.f32.e4m3.e4m3 " HYSCALE_WGMMA_N##N##_REGS ", " A ", " B ", p, 1, 1;\n}\n" \
                    : HYSCALE_WGMMA_N##N##_OUTS                                                    \
                    : "l"(a), "l"(b), "r"(acc));                                                   \
    }                                                                                              \
  };

HYSCALE_DEFINE_WGMMA(16, "%8", "%9", "%10", "%11", "%12")
HYSCALE_DEFINE_WGMMA(32, "%16", "%17", "%18", "%19", "%20")
HYSCALE_DEFINE_WGMMA(64, "%32", "%33", "%34", "%35", "%36")
HYSCALE_DEFINE_WGMMA(128, "%64", "%65", "%66", "%67", "%68")

#undef HYSCALE_DEFINE_WGMMA

// D += A * B^T (bf16, k16) with A in registers: a[4] holds bf16 pairs at rows 16 * warp +
// lane / 4 (a[1], a[3]: + 8) and K columns 2 * (lane % 4) (a[2], a[3]: + 8), which is where an
// m64n16 product's accumulators lie, so a softmax's probabilities feed the next product without a
// trip through shared memory. B as in Wgmma. Always accumulates.
template <int kN, int kTransposeB = 0>
struct WgmmaRegA;

#define HYSCALE_DEFINE_WGMMA_REG_A(N, A, B, TRANS)                                           \
  template <int kTransposeB>                                                                 \
  struct WgmmaRegA<N, kTransposeB> {                                                         \
    static __device__ __forceinline__ void run(float (&d)[N / 2], const uint32_t (&a)[4],    \
                                               uint64_t b) {                                 \
      HYSCALE_WGMMA("wgmma.mma_async.sync.aligned.m64n" #N                                   \
                    "k16.f32.bf16.bf16 " HYSCALE_WGMMA_N##N##_REGS ", " A ", " B             \
                                                                   ", 1, 1, 1, " TRANS ";\n" \
                    : HYSCALE_WGMMA_N##N##_OUTS                                              \
                    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransposeB)); \
    }                                                                                        \
  };

HYSCALE_DEFINE_WGMMA_REG_A(64, "{%32, %33, %34, %35}", "%36", "%37")
HYSCALE_DEFINE_WGMMA_REG_A(128, "{%64, %65, %66, %67}", "%68", "%69")

#undef HYSCALE_DEFINE_WGMMA_REG_A

}  // namespace hyscale::cuda
