// Deterministic accumulation into shared gradient rows: each fp32 contribution is rounded to a
// 64-bit fixed-point integer and added with integer atomics. Integer addition is associative, so
// the sum has the same bits whatever order the blocks run in; a final pass converts it to fp32.
//
// The scale 2^e comes from a bound B that no partial sum can exceed, computed per call on the
// device (no host sync): B * 2^e < 2^61, a factor 4 below int64's range, which covers the fp32
// rounding of the bound and of the contributions and the half unit each rounding to an integer
// adds. The resolution is 2^-e = 2^-61 of B (to within 2x); each contribution is off by at most
// half of it, and the sum of the rounded contributions is exact. Used by sparse_attn/ (dkey,
// dvalue) and indexer_loss.cu (grad_k); docs/sparse_attn.md has the bounds of each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace hyscale::cuda {

// 2^e with bound * 2^e < 2^61 (1 when the bound is 0: every contribution is then 0).
__host__ __device__ inline double fixed_point_scale(double bound) {
  int e;
  return bound > 0 ? (frexp(bound, &e), ldexp(1.0, 61 - e)) : 1.0;
}

__device__ __forceinline__ void fixed_add(unsigned long long* dst, float x, double scale) {
  const long long v = __double2ll_rn(double(x) * scale);
  if (v != 0) atomicAdd(dst, static_cast<unsigned long long>(v));
}

// Raises *out (zeroed by the caller) to a non-negative x: non-negative floats order like their bit
// patterns, so an integer max is a float max, and a max does not depend on the order.
__device__ __forceinline__ void atomic_max_nonnegative(float* out, float x) {
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(x));
}

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// max |x| over n values (bf16 or fp32) into *out (zeroed by the caller); blocks of whole warps.
template <class T>
__global__ void absmax_kernel(const T* x, int64_t n, float* out) {
  float m = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(to_float(x[i])));
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  if ((threadIdx.x & 31) == 0) atomic_max_nonnegative(out, m);
}

// out[i] = fixed[i] / scale as fp32, with scale = scale_of() evaluated on the device (a functor
// holding the bound's inputs, the same one the accumulating kernel used).
template <class ScaleOf>
__global__ void fixed_to_float_kernel(const unsigned long long* fixed, int64_t n, ScaleOf scale_of,
                                      float* out) {
  const double scale = scale_of();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = float(double(static_cast<long long>(fixed[i])) / scale);
  }
}

}  // namespace hyscale::cuda
