// The safetensors file format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header size N, N bytes of JSON naming each tensor's dtype, shape and
// data_offsets [begin, end) into the data that follows (plus an optional "__metadata__" map of
// strings), then the raw little-endian, row-major tensor bytes. Checkpoints written this way load
// with Python's safetensors (e.g. safetensors.torch.load_file). Byte buffers only: no torch here.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace hyscale::trainer {

struct SafeTensor {
  std::string name;
  std::string dtype;  // BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64,
                      // F8_E4M3 or F8_E5M2
  std::vector<int64_t> shape;
  std::string data;  // little-endian, row-major; size = product(shape) * dtype size
};

struct SafetensorsFile {
  std::vector<SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Bytes per element of a safetensors dtype; -1 for an unknown one.
int64_t SafetensorsDtypeSize(std::string_view dtype);

// Tensors are laid out in the order given; the header is padded with spaces so the data starts
// 8-byte aligned. INVALID_ARGUMENT for an empty, repeated or reserved ("__metadata__") name, an
// unknown dtype, a negative dimension or data whose size does not match dtype and shape.
absl::StatusOr<std::string> EncodeSafetensors(const SafetensorsFile& file);

// Validates everything the format promises: header size within the file, a JSON object header,
// known dtypes, sizes matching dtype x shape, offsets within the data and the tensors covering it
// exactly (no gaps, no overlaps). Errors (DATA_LOSS) start with `what` (the file) and name the
// tensor. Tensors come back in data order.
absl::StatusOr<SafetensorsFile> DecodeSafetensors(std::string_view bytes, const std::string& what);

}  // namespace hyscale::trainer
