// Query grouping (key_union.h): the kernels that build the blocks' key lists and their workspace.
#include "kernels/cuda/sparse_attn/key_union.h"

#include <cuda_runtime.h>

#include "kernels/cuda/sparse_attn/launch.cuh"

namespace hyscale::cuda::attn {
namespace {

// G = 1: each query's slots up to and including its last valid one, so that the kernels skip the
// -1 slots after it instead of masking them (a causal query t < k has k - t - 1 of them, its
// last). A warp a query reads its slots from the end, 32 at a time: most stop at the first read.
constexpr int kSlotCountThreads = 256;

__global__ void __launch_bounds__(kSlotCountThreads)
    slot_count_kernel(const int32_t* indices, int n, int topk, int32_t* count) {
  const int64_t query = (int64_t(blockIdx.x) * kSlotCountThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (query >= n) return;
  const int32_t* slots = indices + query * topk;
  for (int end = topk; end > 0; end -= 32) {
    const int slot = end - 32 + lane;
    const unsigned valid = __ballot_sync(0xffffffffu, slot >= 0 && slots[slot] >= 0);
    if (valid != 0) {
      if (lane == 0) count[query] = end - __clz(valid);  // the highest valid slot + 1
      return;
    }
  }
  if (lane == 0) count[query] = 0;
}

// Key union of each group of G queries: the G * topk slots, packed as key << 4 | g, are sorted
// in shared memory (bitonic), then equal keys merge into one entry whose mask ORs their g bits.
constexpr int kUnionThreads = 1024;

__global__ void __launch_bounds__(kUnionThreads)
    build_union_kernel(const int32_t* indices, int n, int topk, int group, int pow2, int32_t* ukeys,
                       uint16_t* umask, int32_t* ucount, int64_t cap) {
  extern __shared__ uint32_t buf[];
  __shared__ int warp_sums[kUnionThreads / 32];
  const int grp = blockIdx.x, tid = threadIdx.x, total = group * topk;
  for (int i = tid; i < pow2; i += kUnionThreads) {
    uint32_t v = 0xffffffffu;
    if (i < total) {
      const int g = i / topk;
      const int64_t query = int64_t(grp) * group + g;
      const int key = query < n ? indices[query * topk + i % topk] : -1;
      if (key >= 0) v = (uint32_t(key) << 4) | uint32_t(g);
    }
    buf[i] = v;
  }
  __syncthreads();
  for (int k = 2; k <= pow2; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < pow2; i += kUnionThreads) {
        const int other = i ^ j;
        if (other > i) {
          const uint32_t a = buf[i], b = buf[other];
          if ((a > b) == ((i & k) == 0)) {
            buf[i] = b;
            buf[other] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  // Each thread owns a contiguous run of slots; count first occurrences, scan, write.
  const int per = (pow2 + kUnionThreads - 1) / kUnionThreads;
  const int lo = min(pow2, tid * per), hi = min(pow2, lo + per);
  auto first = [&](int i) {
    return buf[i] != 0xffffffffu && (i == 0 || (buf[i] >> 4) != (buf[i - 1] >> 4));
  };
  int mine = 0;
  for (int i = lo; i < hi; ++i) mine += first(i);
  int incl = mine;
  const int lane = tid & 31, warp = tid >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffff, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffff, w, o);
      if (lane >= o) w += x;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  int pos = incl - mine + (warp > 0 ? warp_sums[warp - 1] : 0);
  for (int i = lo; i < hi; ++i) {
    if (!first(i)) continue;
    const uint32_t key = buf[i] >> 4;
    uint32_t bits = 0;
    for (int r = i; r < pow2 && (buf[r] >> 4) == key && buf[r] != 0xffffffffu; ++r) {
      bits |= 1u << (buf[r] & 15);
    }
    ukeys[grp * cap + pos] = int32_t(key);
    umask[grp * cap + pos] = uint16_t(bits);
    ++pos;
  }
  if (tid == kUnionThreads - 1) ucount[grp] = warp_sums[31];
}

int next_pow2(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace

size_t plan_bytes(const SparseAttnShape& s, int64_t group) {
  if (group == 1) return align256(s.num_queries * 4);
  const int64_t slots = groups_of(s, group) * group * s.topk;
  return align256(slots * 4) + align256(slots * 2) + align256(groups_of(s, group) * 4);
}

size_t build_plan(const SparseAttnShape& s, const int32_t* indices, int64_t group, void* workspace,
                  UnionPlan& plan, cudaStream_t stream) {
  if (group == 1) {
    plan.count = static_cast<int32_t*>(workspace);
    const int64_t threads = s.num_queries * 32;
    slot_count_kernel<<<static_cast<unsigned>(ceil_div(threads, kSlotCountThreads)),
                        kSlotCountThreads, 0, stream>>>(indices, static_cast<int>(s.num_queries),
                                                        static_cast<int>(s.topk), plan.count);
    check(cudaGetLastError(), "slot_count_kernel");
    return plan_bytes(s, group);
  }
  const int64_t groups = groups_of(s, group);
  plan.cap = group * s.topk;
  auto* base = static_cast<unsigned char*>(workspace);
  plan.keys = reinterpret_cast<int32_t*>(base);
  plan.mask = reinterpret_cast<uint16_t*>(base + align256(groups * plan.cap * 4));
  plan.count = reinterpret_cast<int32_t*>(base + align256(groups * plan.cap * 4) +
                                          align256(groups * plan.cap * 2));
  const int pow2 = next_pow2(static_cast<int>(plan.cap));
  const size_t smem = size_t(pow2) * 4;
  check(cudaFuncSetAttribute(build_union_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "union smem");
  build_union_kernel<<<static_cast<unsigned>(groups), kUnionThreads, smem, stream>>>(
      indices, static_cast<int>(s.num_queries), static_cast<int>(s.topk), static_cast<int>(group),
      pow2, plan.keys, plan.mask, plan.count, plan.cap);
  check(cudaGetLastError(), "build_union_kernel");
  return plan_bytes(s, group);
}

}  // namespace hyscale::cuda::attn
