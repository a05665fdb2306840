// Hopper building blocks of warp-specialized kernels (sm_90a): mbarriers that producer copies and
// consumer warpgroups arrive on, named barriers between warpgroups, register reallocation between
// warpgroups, and the producer's gathering copy with an L2 cache policy.
#pragma once

#include <cstdint>

#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda {

// An mbarrier in shared memory completes a phase when `count` arrivals have been made; phases
// alternate parity 0, 1, 0, ... One thread initializes, then a block barrier publishes it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}
// Makes the initializations visible to the other threads and to the async proxy.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival (release: this thread's earlier shared-memory reads and writes happen before).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   smem_address(bar))
               : "memory");
}
// One arrival on a local mbarrier that also expects `bytes` of transactions in its phase.
__device__ __forceinline__ void mbarrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}
// One arrival once every cp.async this thread issued so far has landed (the arrival is counted
// in the barrier's `count`: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar))
               : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire). A fresh barrier counts its
// phase "before 0" as completed, so the first wait for parity 1 returns at once: buffers start
// out free.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  }
}

// The TMA unit's copy of the box at column x, row y of `map` (tensor_map.h) into shared memory at
// `smem` (1 KB-aligned for the 128-byte swizzle), completing `bytes` of `bar`'s expected
// transactions. The bytes arrive through the async proxy: wgmma reads them after the barrier's
// wait with no proxy fence.
__device__ __forceinline__ void tma_load_2d(void* smem, const void* map, int x, int y,
                                            uint64_t* bar, uint64_t l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_address(smem)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar)), "l"(l2_policy)
      : "memory");
}
// Brings a kernel parameter's tensor map into the descriptor cache before its first copy.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// Named barriers 1..15 (0 is __syncthreads) between subsets of warps: `threads` in all arrive,
// those that sync also wait. A producer of data arrives, its consumer syncs.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Moves registers between warpgroups (sm_90a, like wgmma): a copying warpgroup gives up what the
// math warpgroups take. Every warp of a warpgroup executes the same one.
template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  HYSCALE_WGMMA("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  HYSCALE_WGMMA("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// The warpgroup of this thread, as a value the compiler sees is uniform across each warp
// (ptxas serializes wgmmas under branches it cannot prove warpgroup-uniform).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);
}

}  // namespace hyscale::cuda
