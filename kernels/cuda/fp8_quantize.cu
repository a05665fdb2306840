// Row quantization to fp8 e4m3 with one fp32 scale a row (kernels/fp8.h has the definition), for
// the fp8 scoring path of flash_topk. One warp a row; the hardware conversion rounds to nearest
// even and saturates, as the CPU's software conversion does.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/flash_topk_cuda.h"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/fp8.h"

namespace hyscale::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

__device__ __forceinline__ float load_float(const __nv_bfloat16* x, int64_t i) {
  return __bfloat162float(x[i]);
}
__device__ __forceinline__ float load_float(const float* x, int64_t i) {
  return x[i];
}

template <class In>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    quantize_rows_kernel(const In* x, int64_t rows, int64_t dim, uint8_t* values, float* scales) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const In* in = x + row * dim;
  float amax = 0.f;
  for (int64_t i = lane; i < dim; i += 32) amax = fmaxf(amax, fabsf(load_float(in, i)));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  // Correctly rounded division and product, as on the CPU.
  const float multiplier = amax > 0.f ? __fdiv_rn(kE4m3Max, amax) : 0.f;
  if (lane == 0) scales[row] = __fdiv_rn(amax, kE4m3Max);
  uint8_t* out = values + row * dim;
  for (int64_t i = lane; i < dim; i += 32) {
    out[i] =
        __nv_cvt_float_to_fp8(__fmul_rn(load_float(in, i), multiplier), __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void quantize_rows_e4m3(const void* x, bool x_is_bf16, int64_t rows, int64_t dim, uint8_t* values,
                        float* scales, Stream stream) {
  if (rows == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (x_is_bf16) {
    quantize_rows_kernel<<<blocks, 32 * kRowsPerBlock, 0, cuda_stream>>>(
        static_cast<const __nv_bfloat16*>(x), rows, dim, values, scales);
  } else {
    quantize_rows_kernel<<<blocks, 32 * kRowsPerBlock, 0, cuda_stream>>>(
        static_cast<const float*>(x), rows, dim, values, scales);
  }
  throw_on_error(cudaGetLastError(), "hyscale::quantize_e4m3 (CUDA)", "kernel launch");
}

}  // namespace hyscale::cuda
