// Software e4m3 conversion and row quantization (kernels/fp8.h has the definition).
#include "kernels/fp8.h"

#include <algorithm>
#include <cmath>

namespace hyscale {

uint8_t float_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return 0x7f;  // the one NaN the hardware conversion gives
  const float a = std::fabs(x);
  if (std::isinf(a)) return sign | 0x7e;  // saturation
  constexpr float kMinNormal = 0x1p-6f;
  if (a < kMinNormal) {
    // Subnormals step by 2^-9; a count of 8 is the smallest normal, whose bits are also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  }
  int exponent = 0;
  const float fraction =
      std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  int e = exponent - 1;          // a = (2 * fraction) * 2^e
  int mantissa = static_cast<int>(std::nearbyint((2.f * fraction - 1.f) * 8.f));
  if (mantissa == 8) {
    mantissa = 0;
    ++e;
  }
  // 448 = 1.75 * 2^8 is the largest finite value; beyond it (and for infinity) saturate.
  if (e > 8 || (e == 8 && mantissa == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((e + 7) << 3) | mantissa);
}

float e4m3_to_float(uint8_t value) {
  const float sign = (value & 0x80) ? -1.f : 1.f;
  const int e = (value >> 3) & 0xf, mantissa = value & 0x7;
  if (e == 0xf && mantissa == 0x7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.f + mantissa / 8.f, e - 7);
}

void quantize_rows_e4m3(const float* x, int64_t rows, int64_t dim, uint8_t* values, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * dim;
    float amax = 0.f;
    for (int64_t i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float multiplier = amax > 0.f ? kE4m3Max / amax : 0.f;
    scales[r] = amax / kE4m3Max;
    for (int64_t i = 0; i < dim; ++i) values[r * dim + i] = float_to_e4m3(row[i] * multiplier);
  }
}

}  // namespace hyscale
