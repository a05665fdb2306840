#include "worker/trainer/safetensors.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

namespace hyscale::trainer {
namespace {

constexpr char kMetadataKey[] = "__metadata__";
// The reference implementation refuses larger headers; so do we, before allocating for one.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

// product(shape) * element size, or nullopt for a negative dimension or on overflow.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, int64_t element_size) {
  uint64_t bytes = static_cast<uint64_t>(element_size);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return std::nullopt;
    }
  }
  return bytes;
}

uint64_t read_le64(std::string_view bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

void append_le64(uint64_t value, std::string& out) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

bool is_count(const nlohmann::json& j) {
  return j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0);
}

// One header entry, checked against its dtype and the data section.
struct Entry {
  uint64_t begin = 0, end = 0;
  SafeTensor tensor;
};

// Returns the problem with a tensor's header entry, or "" when it is well formed.
std::string parse_entry(const std::string& name, const nlohmann::json& j, uint64_t data_size,
                        Entry& entry) {
  const std::string where = "tensor '" + name + "'";
  if (!j.is_object() || j.size() != 3 || !j.contains("dtype") || !j.contains("shape") ||
      !j.contains("data_offsets")) {
    return where + " must have exactly dtype, shape and data_offsets";
  }
  const auto& dtype = j["dtype"];
  const auto& shape = j["shape"];
  const auto& offsets = j["data_offsets"];
  if (!dtype.is_string() || SafetensorsDtypeSize(dtype.get<std::string>()) < 0) {
    return where + " has unknown dtype " + dtype.dump();
  }
  if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), is_count)) {
    return where + " has a shape that is not a list of sizes: " + shape.dump();
  }
  if (!offsets.is_array() || offsets.size() != 2 || !is_count(offsets[0]) ||
      !is_count(offsets[1])) {
    return where + " has data_offsets that are not [begin, end]: " + offsets.dump();
  }
  entry.tensor.name = name;
  entry.tensor.dtype = dtype.get<std::string>();
  entry.tensor.shape = shape.get<std::vector<int64_t>>();
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_size) {
    return absl::StrCat(where, " has data_offsets [", entry.begin, ", ", entry.end,
                        "] outside the ", data_size, " data bytes");
  }
  const auto expected = byte_size(entry.tensor.shape, SafetensorsDtypeSize(entry.tensor.dtype));
  if (!expected || *expected != entry.end - entry.begin) {
    return absl::StrCat(where, " has ", entry.end - entry.begin, " bytes but its dtype ",
                        entry.tensor.dtype, " and shape ", shape.dump(), " need ",
                        expected ? absl::StrCat(*expected) : "more than 2^64");
  }
  return "";
}

}  // namespace

int64_t SafetensorsDtypeSize(std::string_view dtype) {
  struct Dtype {
    std::string_view name;
    int64_t size;
  };
  static constexpr Dtype kDtypes[] = {{"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1},
                                      {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2}, {"F16", 2},
                                      {"BF16", 2},    {"U32", 4}, {"I32", 4}, {"F32", 4},
                                      {"U64", 8},     {"I64", 8}, {"F64", 8}};
  for (const Dtype& d : kDtypes) {
    if (d.name == dtype) return d.size;
  }
  return -1;
}

absl::StatusOr<std::string> EncodeSafetensors(const SafetensorsFile& file) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header[kMetadataKey] = file.metadata;
  uint64_t offset = 0;
  for (const SafeTensor& t : file.tensors) {
    const std::string where = "safetensors: tensor '" + t.name + "'";
    if (t.name.empty() || t.name == kMetadataKey || header.contains(t.name)) {
      return absl::InvalidArgumentError(where + ": name is empty, reserved or repeated");
    }
    const int64_t element_size = SafetensorsDtypeSize(t.dtype);
    if (element_size < 0) return absl::InvalidArgumentError(where + ": unknown dtype " + t.dtype);
    const auto expected = byte_size(t.shape, element_size);
    if (!expected || *expected != t.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", t.data.size(), " bytes do not match dtype ", t.dtype,
                       " and shape [", absl::StrJoin(t.shape, ", "), "]"));
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // so the data starts 8-byte aligned

  std::string out;
  out.reserve(8 + text.size() + offset);
  append_le64(text.size(), out);
  out += text;
  for (const SafeTensor& t : file.tensors) out += t.data;
  return out;
}

absl::StatusOr<SafetensorsFile> DecodeSafetensors(std::string_view bytes, const std::string& what) {
  const auto fail = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(what, ": not a valid safetensors file: ", why));
  };
  if (bytes.size() < 8) return fail(absl::StrCat("only ", bytes.size(), " bytes"));
  const uint64_t header_size = read_le64(bytes);
  if (header_size > kMaxHeaderSize || header_size > bytes.size() - 8) {
    return fail(absl::StrCat("header size ", header_size, " exceeds the file (", bytes.size(),
                             " bytes) or the ", kMaxHeaderSize, "-byte limit"));
  }
  const std::string_view header_text = bytes.substr(8, header_size);
  const std::string_view data = bytes.substr(8 + header_size);
  const auto header = nlohmann::json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header_text.empty() || header_text[0] != '{' || header.is_discarded() ||
      !header.is_object()) {
    return fail("header is not a JSON object");
  }

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) return fail("__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) return fail("__metadata__." + key + " is not a string");
        file.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    Entry entry;
    if (const std::string problem = parse_entry(name, value, data.size(), entry);
        !problem.empty()) {
      return fail(problem);
    }
    entries.push_back(std::move(entry));
  }

  // The byte ranges must tile the data exactly: no gaps, no overlaps, nothing after the last.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    if (e.begin != expected) {
      return fail(absl::StrCat("tensor '", e.tensor.name, "' starts at data byte ", e.begin,
                               ", expected ", expected, " (overlap or gap)"));
    }
    expected = e.end;
  }
  if (expected != data.size()) {
    return fail(absl::StrCat("tensors cover ", expected, " of the ", data.size(), " data bytes"));
  }
  for (Entry& e : entries) {
    e.tensor.data.assign(data.substr(e.begin, e.end - e.begin));
    file.tensors.push_back(std::move(e.tensor));
  }
  return file;
}

}  // namespace hyscale::trainer
