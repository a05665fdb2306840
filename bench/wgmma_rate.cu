// The tensor pipe's rate for the issue pattern of the dense target's consumers (m64 n128 k16 bf16,
// K = 576 a tile: 9 column blocks x 4 k-steps, a commit a block, two blocks queued), operands from
// shared memory (SS) or A from registers (RS), 1 or 2 warpgroups a block issuing freely: the
// ceiling of that schedule without its ring, producer and turns. Each line gives the SM clock the
// kernel ran at (its blocks' clock64 cycles over their globaltimer nanoseconds): the tensor
// cores' power depends on the operands' bits, so operands of zeros (whatever shared memory holds)
// run at a clock that random ones may not get. On the GPU machine, from the root:
//   nvcc -std=c++17 -I. -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/rate \
//     bench/wgmma_rate.cu && /tmp/rate
// The grid lines put the same products on the dense target's grid (13,860 blocks of 32 tiles at
// 32K), each block loading its own operands first (its Q, and a key tile), as zeros or random.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/cuda/wgmma.cuh"
using namespace hyscale::cuda;
using bf16 = __nv_bfloat16;

constexpr int kTileElems = 64 * 576, kQElems = 128 * 576;

struct Clock {
  unsigned long long cycles, ns;
};

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// b: when set, each block first copies its own 128 x 576 operand from it (block b's at
// b + blockIdx * 128 * 576, as the dense target's blocks load their Q) and a 64 x 576 key tile
// from a (the same for every block), and waits for them.
template <bool kRegA, int kWgs>
__global__ void __launch_bounds__(128 * kWgs, 1)
    rate(int tiles, const bf16* a, const bf16* b, float* sink, Clock* clock) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* a_tile =
      reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* b_tile = a_tile + kTileElems;  // [128 x 576]
  const long long c0 = clock64();
  const uint64_t t0 = global_ns();
  const int wg = threadIdx.x / 128;
  if (b != nullptr) {
    const bf16* mine = b + static_cast<int64_t>(blockIdx.x) * kQElems;
    for (int i = threadIdx.x; i < kQElems / 8; i += blockDim.x) {
      cp_async_16(b_tile + 8 * i, mine + 8 * i, true);
    }
    for (int i = threadIdx.x; i < kTileElems / 8; i += blockDim.x) {
      cp_async_16(a_tile + 8 * i, a + 8 * i, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  float acc[64];
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  uint32_t a_regs[4] = {threadIdx.x, 2u, 3u, 4u};
  for (int tile = 0; tile < tiles; ++tile) {
    for (int c = 0; c < 9; ++c) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if constexpr (kRegA) {
          WgmmaRegA<128>::run(acc, a_regs, matrix_descriptor<128>(b_tile, 0, 4 * c + ks));
        } else {
          Wgmma<128>::run(acc, matrix_descriptor<64>(a_tile, 0, 4 * c + ks),
                          matrix_descriptor<128>(b_tile, 0, 4 * c + ks), 1);
        }
      }
      wgmma_commit();
      wgmma_wait<2>();
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
  }
  float s = 0.f;
  for (int i = 0; i < 64; ++i) s += acc[i];
  if (s == 12345.f) sink[threadIdx.x + wg] = s;
  if (threadIdx.x == 0) {
    atomicAdd(&clock->cycles, static_cast<unsigned long long>(clock64() - c0));
    atomicAdd(&clock->ns, static_cast<unsigned long long>(global_ns() - t0));
  }
}

// Random bf16 in [-1, 1) from a hash of the index: operands whose bits toggle as real data's do.
__global__ void fill_random(bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16(static_cast<float>(h >> 8) / 8388608.f - 1.f);
  }
}

// `blocks` blocks of `tiles` tiles a warpgroup (0 blocks: one persistent block an SM), each loading
// its operands from a and b when b is set.
template <bool kRegA, int kWgs>
void run(const char* name, float* sink, Clock* clock, int blocks, int tiles, const bf16* a,
         const bf16* b) {
  const int smem = 1024 + (64 + 128) * 576 * 2;
  cudaFuncSetAttribute(rate<kRegA, kWgs>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (blocks == 0) blocks = sms;
  rate<kRegA, kWgs><<<blocks, 128 * kWgs, smem>>>(tiles, a, b, sink, clock);  // warm-up
  cudaMemset(clock, 0, sizeof(Clock));
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0);
  rate<kRegA, kWgs><<<blocks, 128 * kWgs, smem>>>(tiles, a, b, sink, clock);
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  Clock c{};
  cudaMemcpy(&c, clock, sizeof(Clock), cudaMemcpyDeviceToHost);
  const double flops = 2.0 * 64 * 128 * 576 * tiles * kWgs * double(blocks);
  printf("%-58s %8.3f ms  %6.1f TFLOP/s  %5.0f MHz  (%s)\n", name, ms, flops / ms / 1e9,
         1e3 * double(c.cycles) / double(c.ns), cudaGetErrorString(cudaGetLastError()));
}

int main() {
  float* sink;
  Clock* clock;
  cudaMalloc(&sink, 4096);
  cudaMalloc(&clock, sizeof(Clock));
  run<false, 1>("SS m64n128k16, 1 warpgroup", sink, clock, 0, 20000, nullptr, nullptr);
  run<false, 2>("SS m64n128k16, 2 warpgroups", sink, clock, 0, 20000, nullptr, nullptr);
  run<true, 1>("RS m64n128k16, 1 warpgroup", sink, clock, 0, 20000, nullptr, nullptr);
  run<true, 2>("RS m64n128k16, 2 warpgroups", sink, clock, 0, 20000, nullptr, nullptr);
  // The dense target's grid at 32K (990 x 14 blocks, 32 tiles a block: 16 a warpgroup), each
  // block loading its operands, zeros then random; then one persistent block an SM, random.
  const int blocks = 990 * 14;
  const int64_t q_elems = static_cast<int64_t>(blocks) * kQElems;
  bf16 *q, *key;
  cudaMalloc(&q, q_elems * sizeof(bf16));
  cudaMalloc(&key, kTileElems * sizeof(bf16));
  cudaMemset(q, 0, q_elems * sizeof(bf16));
  cudaMemset(key, 0, kTileElems * sizeof(bf16));
  run<false, 2>("SS, 2 warpgroups, the target's grid, zeros", sink, clock, blocks, 16, key, q);
  fill_random<<<1024, 256>>>(q, q_elems);
  fill_random<<<64, 256>>>(key, kTileElems);
  run<false, 2>("SS, 2 warpgroups, the target's grid, random", sink, clock, blocks, 16, key, q);
  run<false, 2>("SS, 2 warpgroups, persistent, random", sink, clock, 0, 20000, key, q);
  run<false, 1>("SS, 1 warpgroup, persistent, random", sink, clock, 0, 20000, key, q);
  return 0;
}
