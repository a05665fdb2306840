#include "worker/model/index_packing.h"

#include <torch/torch.h>

namespace hyscale::trainer {
namespace {

constexpr int64_t kMaxTwoByteKeys = 65535;
constexpr int64_t kTwoByteBias = 32767;

}  // namespace

torch::Tensor pack_indices(const torch::Tensor& indices, int64_t num_keys) {
  if (!indices.defined()) return indices;
  TORCH_CHECK(indices.scalar_type() == torch::kInt, "pack_indices: indices must be int32, got ",
              indices.scalar_type());
  TORCH_CHECK(num_keys <= kMaxPackedKeys, "pack_indices: at most ", kMaxPackedKeys, " keys, got ",
              num_keys);
  if (num_keys <= kMaxTwoByteKeys) return (indices - kTwoByteBias).to(torch::kShort);
  const auto biased = indices + 1;  // -1 .. 2^24 - 2 -> 0 .. 2^24 - 1
  return torch::stack({biased.remainder(256), biased.div(256, "floor").remainder(256),
                       biased.div(65536, "floor")},
                      -1)
      .to(torch::kByte);
}

torch::Tensor unpack_indices(const torch::Tensor& packed) {
  if (!packed.defined() || packed.scalar_type() == torch::kInt) return packed;
  if (packed.scalar_type() == torch::kShort) return packed.to(torch::kInt) + kTwoByteBias;
  TORCH_CHECK(packed.scalar_type() == torch::kByte && packed.size(-1) == 3,
              "unpack_indices: expected int16 or uint8 [..., 3] packing, got ",
              packed.scalar_type(), " ", packed.sizes());
  const auto bytes = packed.to(torch::kInt);
  return bytes.select(-1, 0) + bytes.select(-1, 1) * 256 + bytes.select(-1, 2) * 65536 - 1;
}

}  // namespace hyscale::trainer
