// 16-byte SIMD vectors (4 floats or 2 doubles) through the GCC / Clang vector extension; SSE2 on
// x86-64 and NEON on AArch64 implement them directly. The hot lane loops use them because GCC's
// auto-vectoriser handles those loops badly: it vectorises a tile's dot products over d instead
// of over the lanes (through shuffles, ~5x slower), and leaves a per-lane ReLU as branches.
// Arithmetic on them is lane-wise IEEE: the same bits as the scalar code.
#pragma once

#include <cstdint>
#include <cstring>

namespace hyscale::cpu {

template <typename T>
struct Simd {
  typedef T Vec __attribute__((vector_size(16)));
  static constexpr int64_t kLanes = sizeof(Vec) / sizeof(T);

  static Vec load(const T* p) {  // unaligned
    Vec v;
    std::memcpy(&v, p, sizeof(Vec));
    return v;
  }
  static void store(T* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }
};

}  // namespace hyscale::cpu
