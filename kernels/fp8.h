// fp8 (e4m3) quantization of the lightning indexer's inputs, as DeepSeek-V3.2's indexer scores in
// fp8: every row of d values (a query head, a key) gets one fp32 scale,
//   scale = amax / 448,   value = e4m3(x * (448 / amax))
// with round-to-nearest-even and saturation at +-448 (e4m3 "fn": no infinities, 0x7f is NaN). An
// all-zero row gets scale 0 and zero values. Dequantized, x ~ e4m3_to_float(value) * scale.
//
// Because ReLU is positively homogeneous, the fp8 index score factors the scales out of the
// tensor-core product: I[t,s] = k_scale[s] * sum_h (w[t,h] * q_scale[t,h]) * ReLU(q8[t,h] . k8[s]).
//
// One definition for both backends: the CPU converts in software (here), the GPU with the
// hardware's conversion (kernels/cuda/fp8_quantize.cu); the GPU tests check they agree bit for bit.
#pragma once

#include <cstdint>

namespace hyscale {

inline constexpr float kE4m3Max = 448.f;

uint8_t float_to_e4m3(float x);
float e4m3_to_float(uint8_t value);

// x [rows, dim] -> values [rows, dim] e4m3 bits, scales [rows].
void quantize_rows_e4m3(const float* x, int64_t rows, int64_t dim, uint8_t* values, float* scales);

}  // namespace hyscale
