// Protobuf's JSON mapping as HyScale writes and reads its files and lines: the proto's field names
// (lower_snake_case), every scalar printed (zeros too, so a reader sees the whole record), enums by
// name, and unknown fields refused on reading.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <google/protobuf/message.h>

#include <string>
#include <string_view>

namespace hyscale {

enum class JsonLayout {
  kLine,      // one line, no whitespace: an event line
  kIndented,  // two spaces an indent level: a file for people
};

// Fails only for a message holding an Any or a well-known type out of its range.
absl::StatusOr<std::string> PrintProtoJson(const google::protobuf::Message& message,
                                           JsonLayout layout);

// INVALID_ARGUMENT naming the field path: an unknown field, a value of the wrong type, or an
// integer that does not fit its field (a fraction, or out of range).
absl::Status ParseProtoJson(std::string_view text, google::protobuf::Message* message);

}  // namespace hyscale
