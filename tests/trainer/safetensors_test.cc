// safetensors: round trips, the exact layout of the format, and rejection of malformed files.
#include "worker/trainer/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace hyscale::trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kFile[] = "ckpt/model.safetensors";

std::string floats(std::initializer_list<float> values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

// A file from raw header text and data: the way to write what EncodeSafetensors refuses to.
std::string file_with_header(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string decode_error(const std::string& bytes) {
  auto file = DecodeSafetensors(bytes, kFile);
  EXPECT_TRUE(absl::IsDataLoss(file.status())) << file.status();
  return std::string(file.status().message());
}

SafetensorsFile sample() {
  SafetensorsFile file;
  file.metadata = {{"format", "pt"}, {"step", "100"}};
  file.tensors = {
      {"layers.0.w", "F32", {2, 3}, floats({1, 2, 3, 4, 5, 6})},
      {"embed", "BF16", {3}, std::string("\x01\x02\x03\x04\x05\x06", 6)},
      {"empty", "I64", {0, 4}, ""},
      {"count", "I32", {}, std::string("\x07\0\0\0", 4)},
  };
  return file;
}

TEST(Safetensors, RoundTripKeepsOrderDataAndMetadata) {
  const SafetensorsFile original = sample();
  auto bytes = EncodeSafetensors(original);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto decoded = DecodeSafetensors(*bytes, kFile);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->metadata, original.metadata);
  ASSERT_EQ(decoded->tensors.size(), original.tensors.size());
  for (size_t i = 0; i < original.tensors.size(); ++i) {
    EXPECT_EQ(decoded->tensors[i].name, original.tensors[i].name);
    EXPECT_EQ(decoded->tensors[i].dtype, original.tensors[i].dtype);
    EXPECT_EQ(decoded->tensors[i].shape, original.tensors[i].shape);
    EXPECT_EQ(decoded->tensors[i].data, original.tensors[i].data);
  }
}

TEST(Safetensors, LayoutFollowsTheSpec) {
  SafetensorsFile file;
  file.tensors = {{"w", "F32", {1}, floats({1.5f})}};
  auto bytes = EncodeSafetensors(file);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(*bytes, file_with_header(padded, floats({1.5f})));
  EXPECT_EQ((8 + padded.size()) % 8, 0u);
}

// The example in the reference implementation's documentation.
TEST(Safetensors, ReadsTheReferenceExample) {
  const std::string header = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  auto file = DecodeSafetensors(file_with_header(header, std::string(16, '\0')), kFile);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 1u);
  EXPECT_EQ(file->tensors[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(file->metadata.empty());
}

TEST(Safetensors, EncodeRejectsInconsistentTensors) {
  const auto error = [](SafeTensor t) {
    SafetensorsFile file;
    file.tensors = {{"a", "F32", {1}, floats({0})}, std::move(t)};
    return std::string(EncodeSafetensors(file).status().message());
  };
  EXPECT_THAT(error({"b", "F31", {1}, floats({0})}), HasSubstr("unknown dtype F31"));
  EXPECT_THAT(error({"b", "F32", {2}, floats({0})}), HasSubstr("4 bytes do not match"));
  EXPECT_THAT(error({"b", "F32", {-1}, ""}), HasSubstr("'b'"));
  EXPECT_THAT(error({"a", "F32", {1}, floats({0})}), HasSubstr("repeated"));
  EXPECT_THAT(error({"__metadata__", "F32", {1}, floats({0})}), HasSubstr("reserved"));
}

TEST(Safetensors, RejectsTruncatedFiles) {
  EXPECT_THAT(decode_error("abc"), AllOf(HasSubstr(kFile), HasSubstr("only 3 bytes")));
  auto bytes = EncodeSafetensors(sample());
  ASSERT_TRUE(bytes.ok());
  EXPECT_THAT(decode_error(bytes->substr(0, 20)), HasSubstr("header size"));
  EXPECT_THAT(decode_error(bytes->substr(0, bytes->size() - 1)), HasSubstr(kFile));
}

TEST(Safetensors, RejectsACorruptHeader) {
  EXPECT_THAT(decode_error(file_with_header("[1, 2]", "")), HasSubstr("not a JSON object"));
  EXPECT_THAT(decode_error(file_with_header("{\"a\": ", "")), HasSubstr("not a JSON object"));
  EXPECT_THAT(decode_error(file_with_header(R"({"a":{"dtype":"F32","shape":[1]}})", "")),
              HasSubstr("tensor 'a' must have exactly dtype, shape and data_offsets"));
  EXPECT_THAT(decode_error(file_with_header(
                  R"({"a":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})", "x")),
              HasSubstr("tensor 'a' has unknown dtype \"Q8\""));
  EXPECT_THAT(decode_error(file_with_header(
                  R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "x")),
              HasSubstr("tensor 'a' has a shape"));
  EXPECT_THAT(decode_error(file_with_header(R"({"__metadata__":{"step":3}})", "")),
              HasSubstr("__metadata__.step is not a string"));
}

TEST(Safetensors, RejectsBadOffsets) {
  const std::string data(8, 'x');
  EXPECT_THAT(decode_error(file_with_header(
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data)),
              HasSubstr("tensor 'a' has data_offsets [0, 16] outside the 8 data bytes"));
  EXPECT_THAT(decode_error(file_with_header(
                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", data)),
              HasSubstr("tensor 'a' has 8 bytes but its dtype F32 and shape [1] need 4"));
  EXPECT_THAT(
      decode_error(file_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                    data)),
      HasSubstr("overlap or gap"));
  EXPECT_THAT(decode_error(file_with_header(
                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data)),
              HasSubstr("tensor 'a' starts at data byte 4, expected 0"));
  EXPECT_THAT(decode_error(file_with_header(
                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data)),
              HasSubstr("tensors cover 4 of the 8 data bytes"));
}

}  // namespace
}  // namespace hyscale::trainer
