// Dot products for the CPU kernels: several independent partial sums so the compiler vectorises
// without -ffast-math, summed in a fixed order (deterministic).
#pragma once

#include <cstdint>

namespace hyscale::cpu {

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  constexpr int kLanes = 8;
  T partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) partial[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) partial[0] += a[i] * b[i];
  T total = 0;
  for (int l = 0; l < kLanes; ++l) total += partial[l];
  return total;
}

// y += alpha * x
template <typename T>
inline void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace hyscale::cpu
