// Throughput of fp32 reductions into gathered key rows (576 fp32 a row, 64 rows a tile), as the
// latent backward adds its key gradient: red.global.add.v2 from the wgmma accumulator layout (the
// baseline) against cp.reduce.async.bulk from shared memory (per-warp 256-byte row pieces, single
// and double buffered; whole 2304-byte rows). Checks that every mode gives the same sums.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/reduction_probe \
//       bench/reduction_probe.cu && /tmp/reduction_probe
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>
#include "kernels/cuda/wgmma.cuh"

using namespace hyscale::cuda;
constexpr int D = 576, BK = 64, T = 256;
__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352d;
  x ^= x >> 15;
  x *= 0x846ca68b;
  x ^= x >> 16;
  return x;
}
// Key of row r of tile j of block b: random over m rows, or "local": block b's query b/2 sees a
// window of keys b/2 - 2048 + 64 j + r (adjacent blocks share rows, as in the local benchmark).
__device__ __forceinline__ int key_of(int b, int j, int r, int m, bool local) {
  if (local) {
    int k = b / 2 + 4096 - 2048 + 64 * j + r;
    return k % m;
  }
  return hash(b * 7919u + j * 131u + r) % m;
}
// Mode 0: red.v2 (the kernel's). 1: per-warp staging [16 rows][64] fp32, bulk 256 B a row, single
// buffer. 2: same, double buffer. 3: whole rows: [64][576] staging, one 2304-byte bulk op a row.
template <int MODE>
__global__ void __launch_bounds__(T, 1) probe(float* grad, int m, int tiles, bool local) {
  extern __shared__ __align__(128) float stage[];
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const uint64_t pol = l2_evict_last_policy();
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 1e-3f * (i + 1 + tid % 7);
  const int key_row = 16 * warp + lane / 4;
  for (int j = 0; j < tiles; ++j) {
    int keys[2];
    for (int h = 0; h < 2; ++h) keys[h] = key_of(blockIdx.x, j, key_row + 8 * h, m, local);
    for (int c = wg; c < 9; c += 2) {  // chunks split between warpgroups
      if constexpr (MODE == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* dst = grad + int64_t(keys[h]) * D + c * 64 + 2 * (lane % 4);
#pragma unroll
          for (int n8 = 0; n8 < 8; ++n8)
            asm volatile(
                "red.global.add.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;" ::"l"(dst + 8 * n8),
                "f"(acc[4 * n8 + 2 * h]), "f"(acc[4 * n8 + 2 * h + 1]), "l"(pol)
                : "memory");
        }
      } else if constexpr (MODE == 1 || MODE == 2) {
        const int buf = MODE == 2 ? (c / 2) % 2 : 0;
        float* ws = stage + ((tid / 32) * 2 + buf) * 16 * 64;
        if (MODE == 1)
          bulk_wait_read<0>();
        else
          bulk_wait_read<1>();
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int n8 = 0; n8 < 8; ++n8)
            *reinterpret_cast<float2*>(ws + (lane / 4 + 8 * h) * 64 + 8 * n8 + 2 * (lane % 4)) =
                make_float2(acc[4 * n8 + 2 * h], acc[4 * n8 + 2 * h + 1]);
        fence_async_shared();
        __syncwarp();
        if (lane < 16) {
          const int row = 16 * warp + lane;
          bulk_reduce_add(grad + int64_t(key_of(blockIdx.x, j, row, m, local)) * D + c * 64,
                          ws + lane * 64, 256, pol);
        }
        bulk_commit();
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int n8 = 0; n8 < 8; ++n8)
            *reinterpret_cast<float2*>(stage + (key_row + 8 * h) * D + c * 64 + 8 * n8 +
                                       2 * (lane % 4)) =
                make_float2(acc[4 * n8 + 2 * h], acc[4 * n8 + 2 * h + 1]);
      }
    }
    if constexpr (MODE == 3) {
      fence_async_shared();
      __syncthreads();
      if (tid < BK) {
        bulk_reduce_add(grad + int64_t(key_of(blockIdx.x, j, tid, m, local)) * D, stage + tid * D,
                        D * 4, pol);
        bulk_commit();
        bulk_wait_read<0>();
      }
      __syncthreads();
    }
  }
  if constexpr (MODE != 0) bulk_wait_read<0>();
  bulk_wait_all();
}

template <int MODE>
float run(float* grad, int m, int tiles, bool local, int blocks, int reps = 6) {
  const int smem = MODE == 3 ? BK * D * 4 : 160 * 1024;  // one block an SM, as the kernel
  cudaFuncSetAttribute(probe<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    probe<MODE><<<blocks, T, smem>>>(grad, m, tiles, local);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    if (r || reps == 1) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaError_t e = cudaGetLastError();
  if (e) {
    printf("error %s\n", cudaGetErrorString(e));
  }
  return ms[ms.size() / 2];
}
int main() {
  const int tiles = 64;
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int m : {32768, 131072}) {
    float* grad;
    cudaMalloc(&grad, size_t(m) * D * 4);
    cudaMemset(grad, 0, size_t(m) * D * 4);
    for (bool local : {true, false}) {
      for (int blocks : {sms, 4 * sms}) {
        const double bytes = double(blocks) * tiles * BK * D * 4;
        float t0 = run<0>(grad, m, tiles, local, blocks),
              t1 = run<1>(grad, m, tiles, local, blocks),
              t2 = run<2>(grad, m, tiles, local, blocks),
              t3 = run<3>(grad, m, tiles, local, blocks);
        printf(
            "m %6d %-6s blocks %4d: red.v2 %6.2f TB/s  bulk256 %6.2f  bulk256x2 %6.2f  bulkrow "
            "%6.2f\n",
            m, local ? "local" : "random", blocks, bytes / t0 / 1e9, bytes / t1 / 1e9,
            bytes / t2 / 1e9, bytes / t3 / 1e9);
      }
    }
    // Check: the same sums from every mode (one launch each, from zeros).
    std::vector<float> ref(size_t(m) * D), got(size_t(m) * D);
    auto once = [&](auto fn, std::vector<float>& out) {
      cudaMemset(grad, 0, size_t(m) * D * 4);
      fn();
      cudaMemcpy(out.data(), grad, out.size() * 4, cudaMemcpyDeviceToHost);
    };
    once([&] { run<0>(grad, m, tiles, false, sms, 1); }, ref);
    double worst = 0;
    for (int mode = 1; mode <= 3; ++mode) {
      once(
          [&] {
            if (mode == 1)
              run<1>(grad, m, tiles, false, sms, 1);
            else if (mode == 2)
              run<2>(grad, m, tiles, false, sms, 1);
            else
              run<3>(grad, m, tiles, false, sms, 1);
          },
          got);
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, double(std::abs(got[i] - ref[i])) / (1e-6 + std::abs(ref[i])));
    }
    printf("m %d check: worst relative difference %.2e\n", m, worst);
    cudaFree(grad);
  }
  return 0;
}
