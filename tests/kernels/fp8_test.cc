// The software e4m3 conversion and row quantization of kernels/fp8.h: exact codes, rounding to
// nearest even between neighbouring codes, saturation, and the row scale.
#include "kernels/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace hyscale {
namespace {

bool is_nan_code(int code) {
  return (code & 0x7f) == 0x7f;
}

TEST(Fp8Test, KnownCodes) {
  EXPECT_EQ(float_to_e4m3(0.f), 0x00);
  EXPECT_EQ(float_to_e4m3(1.f), 0x38);
  EXPECT_EQ(float_to_e4m3(-1.f), 0xb8);
  EXPECT_EQ(float_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(0x1p-6f), 0x08);  // smallest normal
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0xb8), -1.f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_EQ(float_to_e4m3(std::nanf("")), 0x7f);
}

TEST(Fp8Test, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(code))), code) << "code " << code;
  }
}

TEST(Fp8Test, RoundsToNearestEvenBetweenCodes) {
  // Positive codes in increasing order; the midpoint of two neighbours goes to the even one,
  // anything off the midpoint to the nearer one.
  for (int code = 0; code + 1 < 0x7f; ++code) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(code));
    const float hi = e4m3_to_float(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;  // exact: e4m3 values have 4 significant bits
    const int even = code % 2 == 0 ? code : code + 1;
    EXPECT_EQ(float_to_e4m3(mid), even) << "between codes " << code << " and " << code + 1;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, lo)), code);
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, hi)), code + 1);
    EXPECT_EQ(float_to_e4m3(-std::nextafter(mid, hi)), 0x80 | (code + 1));
  }
}

TEST(Fp8Test, SaturatesBeyondTheLargestFiniteValue) {
  EXPECT_EQ(float_to_e4m3(460.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
}

TEST(Fp8Test, RowsGetScaleAmaxOver448) {
  const std::vector<float> x = {1.f, -2.f, 0.5f, 0.25f,  // amax 2
                                0.f, 0.f,  0.f,  0.f};   // all zero
  std::vector<uint8_t> values(8);
  std::vector<float> scales(2);
  quantize_rows_e4m3(x.data(), 2, 4, values.data(), scales.data());
  EXPECT_EQ(scales[0], 2.f / 448.f);
  EXPECT_EQ(values[1], float_to_e4m3(-448.f));
  EXPECT_EQ(values[0], float_to_e4m3(224.f));
  EXPECT_EQ(scales[1], 0.f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(values[i], 0x00);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(e4m3_to_float(values[i]) * scales[0], x[i], std::fabs(x[i]) / 16) << i;
  }
}

}  // namespace
}  // namespace hyscale
