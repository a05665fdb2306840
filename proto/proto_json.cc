#include "proto/proto_json.h"

#include <google/protobuf/util/json_util.h>

namespace hyscale {

absl::StatusOr<std::string> PrintProtoJson(const google::protobuf::Message& message,
                                           JsonLayout layout) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = layout == JsonLayout::kIndented;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
      !status.ok()) {
    return absl::InternalError(std::string(status.message()));
  }
  return json;
}

absl::Status ParseProtoJson(std::string_view text, google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), message, options);
  if (!status.ok()) return absl::InvalidArgumentError(std::string(status.message()));
  return absl::OkStatus();
}

}  // namespace hyscale
