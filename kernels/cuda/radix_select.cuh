// Block-wide exact selection over arrays in global memory, by radix: four passes of 8-bit digits
// with a shared-memory histogram, each pass keeping only the entries whose higher digits match.
#pragma once

#include <cstdint>

namespace hyscale::cuda {

// Order-preserving map of a float to uint32 (larger float -> larger key; -inf smallest).
__device__ __forceinline__ uint32_t ordered_key(float value) {
  const uint32_t bits = __float_as_uint(value);
  return bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
}
__device__ __forceinline__ float from_ordered_key(uint32_t key) {
  return __uint_as_float(key ^ ((key >> 31) ? 0x80000000u : 0xffffffffu));
}

struct RadixSelection {
  uint32_t key;  // the r-th largest key
  int greater;   // entries with a larger key
  int equal;     // entries with exactly this key
};

// Shared memory a selection needs: a 256-bin histogram and the broadcast of each pass's result.
struct RadixSelectShared {
  int histogram[256];
  int digit;
  int above;
};

// The r-th largest (1-based) of the keys key_of(i) for i in [0, n) where key_of returns true.
// All threads of the block call it with the same arguments; r must be in [1, matching count].
template <class KeyOf>
__device__ RadixSelection block_radix_select(int n, int r, KeyOf key_of, RadixSelectShared& s) {
  uint32_t prefix = 0, mask = 0;
  int greater = 0, equal = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.histogram[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      uint32_t key;
      if (key_of(i, key) && (key & mask) == prefix)
        atomicAdd(&s.histogram[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = 255;
      for (; digit > 0; --digit) {
        if (above + s.histogram[digit] >= r) break;
        above += s.histogram[digit];
      }
      s.digit = digit;
      s.above = above;
    }
    __syncthreads();
    const int digit = s.digit, above = s.above;
    equal = s.histogram[digit];
    greater += above;
    r -= above;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
    __syncthreads();  // the histogram is cleared next pass
  }
  return {prefix, greater, equal};
}

// Sorts `n` (a power of two) 64-bit keys in shared memory ascending; the whole block takes part.
__device__ __forceinline__ void block_bitonic_sort(unsigned long long* keys, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int partner = i ^ stride;
        if (partner > i) {
          const bool ascending = (i & size) == 0;
          const unsigned long long a = keys[i], b = keys[partner];
          if ((a > b) == ascending) {
            keys[i] = b;
            keys[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace hyscale::cuda
