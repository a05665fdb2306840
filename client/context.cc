#include "client/context.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <google/protobuf/util/json_util.h>

#include <random>

#include "proto/job_spec.h"

namespace hyscale::cli {

int Fail(const Context& context, const std::string& what, const absl::Status& status) {
  *context.err << "hyscale: " << what << ": " << status.message() << " ("
               << absl::StatusCodeToString(status.code()) << ")\n";
  return ExitCodeFor(status);
}

int Fail(const Context& context, const std::string& what, const grpc::Status& status) {
  return Fail(context, what, rpc::FromGrpc(status));
}

void PrintJson(const Context& context, const google::protobuf::Message& message, bool one_line) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = !one_line;
  std::string json;
  if (auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
      !status.ok()) {
    *context.err << "hyscale: cannot print JSON: " << status.ToString() << "\n";
    return;
  }
  if (!json.empty() && json.back() == '\n') json.pop_back();
  *context.out << json << "\n" << std::flush;
}

absl::StatusOr<std::unique_ptr<v1::JobService::Stub>> JobStub(const Context& context) {
  auto channel = rpc::Connect(context.client);
  if (!channel.ok()) return channel.status();
  return v1::JobService::NewStub(*channel);
}

absl::StatusOr<std::unique_ptr<v1::WorkerService::Stub>> WorkerStub(const Context& context) {
  auto channel = rpc::Connect(context.client);
  if (!channel.ok()) return channel.status();
  return v1::WorkerService::NewStub(*channel);
}

absl::StatusOr<v1::JobSpec> LoadValidSpec(const std::string& path) {
  auto spec = LoadJobSpec(path);
  // A missing or unreadable file is a bad argument to the command, not a missing server object.
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  if (auto status = ValidateJobSpec(*spec); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid job spec: ", status.message()));
  }
  return spec;
}

std::string RandomRequestId() {
  std::random_device device;
  std::mt19937_64 random((static_cast<uint64_t>(device()) << 32) ^ device());
  const uint64_t high = (random() & ~uint64_t{0xF000}) | 0x4000;                     // version 4
  const uint64_t low = (random() & ~(uint64_t{0xC} << 60)) | (uint64_t{0x8} << 60);  // variant
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", high >> 32, (high >> 16) & 0xFFFF,
                         high & 0xFFFF, low >> 48, low & 0xFFFFFFFFFFFF);
}

}  // namespace hyscale::cli
