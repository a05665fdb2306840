// The top-k indices a recomputed layer keeps for selection replay, in fewer bytes than int32: they
// span the whole sequence (k entries a token and layer, 32 GiB for 4 layers at 1M tokens), so at
// long context they are a large share of what a step holds.
//   M <= 65535 keys: 2 bytes an entry, int16 (index - 32767; -1 is -32768);
//   otherwise (M < 2^24): 3 bytes an entry, uint8 [..., k, 3], little-endian index + 1 (-1 is 0).
// Packing is exact: unpack(pack(indices, M)) == indices.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace hyscale::trainer {

// The largest key count packing takes (3-byte entries).
inline constexpr int64_t kMaxPackedKeys = (int64_t(1) << 24) - 1;

// indices int32 [..., k] with entries -1 or in [0, num_keys); undefined stays undefined.
torch::Tensor pack_indices(const torch::Tensor& indices, int64_t num_keys);
// int32 [..., k] from either packing; int32 input is returned as it is.
torch::Tensor unpack_indices(const torch::Tensor& packed);

}  // namespace hyscale::trainer
