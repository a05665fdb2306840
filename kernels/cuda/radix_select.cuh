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

// Blocks that select have this many threads: one histogram bin a thread.
inline constexpr int kRadixSelectThreads = 256;

// Shared memory a selection needs: a 256-bin histogram, the per-warp totals of the digit search
// and the broadcast of each pass's result.
struct RadixSelectShared {
  int histogram[256];
  int warp_totals[kRadixSelectThreads / 32];
  int digit;
  int above;
};

// The r-th largest (1-based) of the keys key_of(i) for i in [0, n) where key_of returns true.
// All kRadixSelectThreads threads of the block call it with the same arguments; r must be in
// [1, matching count].
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
    // The digit holding the r-th largest: thread t takes digit 255 - t, so a prefix sum over the
    // threads counts the entries at or above each digit (one thread scanning the 256 bins
    // serially was most of the finishing kernel's time).
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int count = s.histogram[255 - threadIdx.x];
    int at_or_above = count;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int lower = __shfl_up_sync(0xffffffffu, at_or_above, offset);
      if (lane >= offset) at_or_above += lower;
    }
    if (lane == 31) s.warp_totals[warp] = at_or_above;
    __syncthreads();
    for (int w = 0; w < warp; ++w) at_or_above += s.warp_totals[w];
    const int above_digit = at_or_above - count;
    // Exactly one digit has above < r <= at_or_above; digit 0 takes an r past every entry.
    if ((above_digit < r && r <= at_or_above) || (threadIdx.x == 255 && r > at_or_above)) {
      s.digit = 255 - threadIdx.x;
      s.above = above_digit;
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

// One step (merge size, stride) of the bitonic network over n keys in shared memory. The block's
// `threads` threads walk its n / 2 compare-exchange pairs directly (rather than all n entries with
// half of them idle: the sort was most of the finishing kernel's time); no barrier.
__device__ __forceinline__ void bitonic_step_shared(unsigned long long* keys, int n, int size,
                                                    int stride, int threads) {
  for (int pair = threadIdx.x; pair < n / 2; pair += threads) {
    // The pair's lower entry has a zero at the stride bit, its partner a one.
    const int i = ((pair & ~(stride - 1)) << 1) | (pair & (stride - 1));
    const bool ascending = (i & size) == 0;
    const unsigned long long a = keys[i], b = keys[i + stride];
    if ((a > b) == ascending) {
      keys[i] = b;
      keys[i + stride] = a;
    }
  }
}

// Sorts `n` (a power of two) 64-bit keys in shared memory ascending; the whole block takes part.
__device__ __forceinline__ void block_bitonic_sort(unsigned long long* keys, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      bitonic_step_shared(keys, n, size, stride, blockDim.x);
      __syncthreads();
    }
  }
}

// The same sort for n = kPerThread * kRadixSelectThreads keys, with each thread holding
// kPerThread consecutive keys in registers: compare-exchanges within a thread happen in
// registers, those within a warp through shuffles, and only strides of a warp's span or more go
// through shared memory (6 of the 66 steps at n = 2048, instead of all of them).
template <int kPerThread>
__device__ __forceinline__ void block_bitonic_sort_registers(unsigned long long* keys) {
  constexpr int kN = kPerThread * kRadixSelectThreads, kWarpSpan = kPerThread * 32;
  const int first = threadIdx.x * kPerThread;
  unsigned long long v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) v[j] = keys[first + j];
  for (int size = 2; size <= kN; size <<= 1) {
    int stride = size >> 1;
    if (stride >= kWarpSpan) {
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) keys[first + j] = v[j];
      __syncthreads();
      for (; stride >= kWarpSpan; stride >>= 1) {
        bitonic_step_shared(keys, kN, size, stride, kRadixSelectThreads);
        __syncthreads();
      }
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) v[j] = keys[first + j];
      __syncthreads();  // every thread has read before the next store
    }
    for (; stride >= kPerThread; stride >>= 1) {
      const int lane_distance = stride / kPerThread;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, v[j], lane_distance);
        const int i = first + j;
        const bool keep_smaller = ((i & stride) == 0) == ((i & size) == 0);
        v[j] = keep_smaller ? min(v[j], other) : max(v[j], other);
      }
    }
    // Strides below kPerThread, unrolled so that v stays in registers.
#pragma unroll
    for (int in_thread = kPerThread / 2; in_thread > 0; in_thread >>= 1) {
      if (in_thread > stride) continue;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        if (j & in_thread) continue;
        const bool ascending = ((first + j) & size) == 0;
        const unsigned long long a = v[j], b = v[j + in_thread];
        if ((a > b) == ascending) {
          v[j] = b;
          v[j + in_thread] = a;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) keys[first + j] = v[j];
  __syncthreads();
}

}  // namespace hyscale::cuda
