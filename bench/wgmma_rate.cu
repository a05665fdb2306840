// The tensor pipe's rate for the issue pattern of the dense target's consumers (m64 n128 k16 bf16,
// K = 576 a tile: 9 column blocks x 4 k-steps, a commit a block, two blocks queued), operands from
// shared memory (SS) or A from registers (RS), 1 or 2 warpgroups a block issuing freely, one
// block an SM: the ceiling of that schedule without its ring, producer and turns. Operand values
// are whatever shared memory holds; only the time counts. On the GPU machine, from the root:
//   nvcc -std=c++17 -I. -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/rate \
//     bench/wgmma_rate.cu && /tmp/rate
#include <cuda_runtime.h>
#include <cstdio>
#include "kernels/cuda/wgmma.cuh"
using namespace hyscale::cuda;
using bf16 = __nv_bfloat16;

template <bool kRegA, int kWgs>
__global__ void __launch_bounds__(128 * kWgs, 1) rate(int tiles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* a_tile =
      reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* b_tile = a_tile + 64 * 576;  // [128 x 576]
  const int wg = threadIdx.x / 128;
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

template <bool kRegA, int kWgs>
void run(const char* name, float* sink) {
  const int smem = 1024 + (64 + 128) * 576 * 2;
  cudaFuncSetAttribute(rate<kRegA, kWgs>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = 20000;
  rate<kRegA, kWgs><<<sms, 128 * kWgs, smem>>>(10, sink);
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0);
  rate<kRegA, kWgs><<<sms, 128 * kWgs, smem>>>(tiles, sink);
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  const double flops = 2.0 * 64 * 128 * 576 * tiles * kWgs * double(sms);
  printf("%-28s %8.3f ms  %6.1f TFLOP/s  (%s)\n", name, ms, flops / ms / 1e9,
         cudaGetErrorString(cudaGetLastError()));
}

int main() {
  float* sink;
  cudaMalloc(&sink, 4096);
  run<false, 1>("SS m64n128k16, 1 warpgroup", sink);
  run<false, 2>("SS m64n128k16, 2 warpgroups", sink);
  run<true, 1>("RS m64n128k16, 1 warpgroup", sink);
  run<true, 2>("RS m64n128k16, 2 warpgroups", sink);
  return 0;
}
