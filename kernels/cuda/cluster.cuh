// Thread-block clusters (sm_90): a block's rank, the cluster-wide barrier, and one-way signalling
// between the blocks' shared memories (stores that complete on the receiver's mbarrier, arrivals
// on a partner's mbarrier), which a block waits for with the plain mbarrier_wait. Nothing on the
// signals' path orders at cluster scope: a cluster-scope acquire invalidates the L1 (`CCTL.IVALL`,
// as after `barrier.cluster.wait`) and a cluster-scope release waits for every memory operation
// in flight, the reductions into global memory included (`MEMBAR.ALL.GPU`).
#pragma once

#include <cstdint>

#include "kernels/cuda/warp_specialization.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda {

__device__ __forceinline__ int cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return static_cast<int>(rank);
}

// Every thread of every block of the cluster arrives, then waits (release, acquire): what a block
// initialized before is visible to the others, and no block leaves while another may still
// access its shared memory.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// The address of the counterpart of shared-memory address `local` (smem_address) in the shared
// memory of block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

// 16 bytes into another block's shared memory; they count as 16 bytes of transactions on that
// block's mbarrier `remote_bar` (release at cluster scope once they land).
__device__ __forceinline__ void store_remote(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(remote),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

// One arrival on another block's mbarrier, relaxed: a caller that signals it has read shared
// memory arrives only after the loaded values have been used, so the loads have completed.
__device__ __forceinline__ void arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar)
               : "memory");
}

// Adds 16 bytes of this block's shared memory (at a shared-memory address), eight bf16 in four
// pairs (the first of each in the low half), to a[0..7]. Load and additions are one statement so
// that the compiler does not hoist a run of loads ahead of their additions, which takes more
// registers than a kernel full of accumulators has to spare.
__device__ __forceinline__ void add_bf16_from_shared(float* a, uint32_t local) {
  asm volatile(
      "{\n.reg .b32 x, y, z, w, lo, hi;\nld.shared.v4.b32 {x, y, z, w}, [%8];\n"
      "shl.b32 lo, x, 16;\nand.b32 hi, x, 0xffff0000;\nadd.f32 %0, %0, lo;\nadd.f32 %1, %1, hi;\n"
      "shl.b32 lo, y, 16;\nand.b32 hi, y, 0xffff0000;\nadd.f32 %2, %2, lo;\nadd.f32 %3, %3, hi;\n"
      "shl.b32 lo, z, 16;\nand.b32 hi, z, 0xffff0000;\nadd.f32 %4, %4, lo;\nadd.f32 %5, %5, hi;\n"
      "shl.b32 lo, w, 16;\nand.b32 hi, w, 0xffff0000;\nadd.f32 %6, %6, lo;\nadd.f32 %7, %7, hi;\n"
      "}\n"
      : "+f"(a[0]), "+f"(a[1]), "+f"(a[2]), "+f"(a[3]), "+f"(a[4]), "+f"(a[5]), "+f"(a[6]),
        "+f"(a[7])
      : "r"(local)
      : "memory");
}

}  // namespace hyscale::cuda
