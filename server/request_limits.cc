#include "server/request_limits.h"

#include <absl/strings/str_cat.h>

#include <string>

#include "hyscale/v1/service.pb.h"

namespace hyscale::server {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

size_t ByteCap(const FieldDescriptor& field) {
  // A trainer's output, forwarded by its agent in chunks of at most this size.
  if (field.containing_type() == v1::RankReport::descriptor()) return kMaxReportChunkBytes;
  return kMaxFieldBytes;
}

absl::Status TooBig(const std::string& path, size_t size, size_t cap, const char* unit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": ", size, " ", unit, " exceeds the limit of ", cap));
}

absl::Status Check(const Message& message, const std::string& prefix) {
  const Reflection& reflection = *message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection.ListFields(message, &fields);  // only those set
  for (const FieldDescriptor* field : fields) {
    const std::string path =
        prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    const bool text = field->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
    const bool nested = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!field->is_repeated()) {
      if (text) {
        std::string scratch;
        const size_t size = reflection.GetStringReference(message, field, &scratch).size();
        if (size > ByteCap(*field)) return TooBig(path, size, ByteCap(*field), "bytes");
      } else if (nested) {
        if (auto status = Check(reflection.GetMessage(message, field), path); !status.ok()) {
          return status;
        }
      }
      continue;
    }
    const int count = reflection.FieldSize(message, field);
    if (count > kMaxRepeatedEntries) return TooBig(path, count, kMaxRepeatedEntries, "entries");
    for (int i = 0; i < count; ++i) {
      const std::string item = absl::StrCat(path, "[", i, "]");
      if (text) {
        std::string scratch;
        const size_t size =
            reflection.GetRepeatedStringReference(message, field, i, &scratch).size();
        if (size > ByteCap(*field)) return TooBig(item, size, ByteCap(*field), "bytes");
      } else if (nested) {
        if (auto status = Check(reflection.GetRepeatedMessage(message, field, i), item);
            !status.ok()) {
          return status;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFieldSizes(const Message& request) {
  return Check(request, "");
}

}  // namespace hyscale::server
