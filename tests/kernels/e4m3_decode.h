// e4m3 codes (uint8 tensors from hyscale::quantize_e4m3) to their values, for the fp8 tests'
// references; libtorch 1.13 has no fp8 dtype to do it.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "kernels/fp8.h"

namespace hyscale::test {

inline torch::Tensor decode_e4m3(const torch::Tensor& bits) {
  auto lookup = torch::empty({256}, torch::kDouble);
  for (int code = 0; code < 256; ++code) {
    lookup[code] = static_cast<double>(e4m3_to_float(static_cast<uint8_t>(code)));
  }
  return lookup.index_select(0, bits.cpu().flatten().to(torch::kLong)).reshape(bits.sizes());
}

}  // namespace hyscale::test
