// The tensor pipe's rate for the issue pattern of the dense target's consumers (m64 n128 k16 bf16,
// K = 576 a tile: 9 column blocks x 4 k-steps, a commit a block, two blocks queued), operands from
// shared memory (SS) or A from registers (RS), 1 or 2 warpgroups a block issuing freely, one
// block an SM: the ceiling of that schedule without its ring, producer and turns. Operand values
// are whatever shared memory holds; only the time counts. On the GPU machine, from the root:
//   nvcc -std=c++17 -I. -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/rate \
//     bench/wgmma_rate.cu && /tmp/rate
// The last two lines put the same products on the dense target's grid (13,860 blocks of 32 tiles at
// 32K), without and with each block loading its own Q first.
#include <cuda_runtime.h>
#include <cstdio>
#include "kernels/cuda/wgmma.cuh"
using namespace hyscale::cuda;
using bf16 = __nv_bfloat16;

// q: when set, each block first copies its own 128 x 576 B operand from it (block b's at
// q + b * 128 * 576), as the dense target's blocks load their Q, and waits for it.
template <bool kRegA, int kWgs>
__global__ void __launch_bounds__(128 * kWgs, 1) rate(int tiles, const bf16* q, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* a_tile =
      reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* b_tile = a_tile + 64 * 576;  // [128 x 576]
  const int wg = threadIdx.x / 128;
  if (q != nullptr) {
    const bf16* mine = q + static_cast<int64_t>(blockIdx.x) * 128 * 576;
    for (int i = threadIdx.x; i < 128 * 576 / 8; i += blockDim.x) {
      cp_async_16(b_tile + 8 * i, mine + 8 * i, true);
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
}

// `blocks` blocks of `tiles` tiles a warpgroup (0 blocks: one persistent block an SM), each loading
// its own B operand from q when set.
template <bool kRegA, int kWgs>
void run(const char* name, float* sink, int blocks, int tiles, const bf16* q) {
  const int smem = 1024 + (64 + 128) * 576 * 2;
  cudaFuncSetAttribute(rate<kRegA, kWgs>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (blocks == 0) blocks = sms;
  rate<kRegA, kWgs><<<blocks, 128 * kWgs, smem>>>(tiles, q, sink);  // warm-up
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0);
  rate<kRegA, kWgs><<<blocks, 128 * kWgs, smem>>>(tiles, q, sink);
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  const double flops = 2.0 * 64 * 128 * 576 * tiles * kWgs * double(blocks);
  printf("%-52s %8.3f ms  %6.1f TFLOP/s  (%s)\n", name, ms, flops / ms / 1e9,
         cudaGetErrorString(cudaGetLastError()));
}

int main() {
  float* sink;
  cudaMalloc(&sink, 4096);
  run<false, 1>("SS m64n128k16, 1 warpgroup", sink, 0, 20000, nullptr);
  run<false, 2>("SS m64n128k16, 2 warpgroups", sink, 0, 20000, nullptr);
  run<true, 1>("RS m64n128k16, 1 warpgroup", sink, 0, 20000, nullptr);
  run<true, 2>("RS m64n128k16, 2 warpgroups", sink, 0, 20000, nullptr);
  // The dense target's grid at 32K (990 x 14 blocks, 32 tiles a block: 16 a warpgroup), without
  // and with each block's own Q load first.
  const int blocks = 990 * 14;
  bf16* q;
  cudaMalloc(&q, static_cast<size_t>(blocks) * 128 * 576 * sizeof(bf16));
  cudaMemset(q, 0, static_cast<size_t>(blocks) * 128 * 576 * sizeof(bf16));
  run<false, 2>("SS, 2 warpgroups, the target's grid", sink, blocks, 16, nullptr);
  run<false, 2>("SS, 2 warpgroups, the target's grid, Q loaded a block", sink, blocks, 16, q);
  return 0;
}
