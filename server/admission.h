// What every gRPC call passes before it reaches the coordinator, and how the coordinator's answer
// goes back, shared by JobService and WorkerService.
#pragma once

#include <absl/status/statusor.h>
#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <utility>

#include "proto/rpc.h"

namespace hyscale::server {

// OK when the call's token grants `access` and every field of `request` is within its cap
// (request_limits.h); else UNAUTHENTICATED or INVALID_ARGUMENT.
grpc::Status Admit(const grpc::ServerContextBase& context, const rpc::ServerTokens& tokens,
                   rpc::Access access, const google::protobuf::Message& request);

// Copies a successful result into the response, or maps the error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return rpc::ToGrpc(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace hyscale::server
