// Thread-block clusters (sm_90): a block's rank, the cluster-wide barrier, and one-way signalling
// between the blocks' shared memories (stores that complete on the receiver's mbarrier, arrivals
// on a partner's mbarrier), which a block waits for with the plain mbarrier_wait. Nothing on the
// signals' path orders at cluster scope: a cluster-scope acquire invalidates the L1 (`CCTL.IVALL`,
// as after `barrier.cluster.wait`) and a cluster-scope release waits for every memory operation
// in flight, the reductions into global memory included (`MEMBAR.ALL.GPU`).
#pragma once

#include <cstdint>

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
__device__ __forceinline__ void store_remote(uint32_t remote, float4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(remote),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(remote_bar)
      : "memory");
}

// One arrival on another block's mbarrier, relaxed: a caller that signals it has read shared
// memory arrives only after the loaded values have been used, so the loads have completed.
__device__ __forceinline__ void arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar)
               : "memory");
}

// One arrival on a local mbarrier that also expects `bytes` of transactions in its phase.
__device__ __forceinline__ void mbarrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

// Adds 16 bytes of this block's shared memory (at a shared-memory address) to a, b, c, d. Load and
// additions are one statement so that the compiler does not hoist a run of loads ahead of their
// additions, which takes more registers than a kernel full of accumulators has to spare.
__device__ __forceinline__ void add_from_shared(float& a, float& b, float& c, float& d,
                                                uint32_t local) {
  asm volatile(
      "{\n.reg .f32 x, y, z, w;\nld.shared.v4.f32 {x, y, z, w}, [%4];\n"
      "add.f32 %0, %0, x;\nadd.f32 %1, %1, y;\nadd.f32 %2, %2, z;\nadd.f32 %3, %3, w;\n}\n"
      : "+f"(a), "+f"(b), "+f"(c), "+f"(d)
      : "r"(local)
      : "memory");
}

}  // namespace hyscale::cuda
