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

// Admits the call, then answers it with `serve()`, an absl::StatusOr<T> from the coordinator: its
// value becomes the response, its error the call's status.
template <typename T, typename ServeFn>
grpc::Status AdmitThenServe(const grpc::ServerContextBase& context, const rpc::ServerTokens& tokens,
                            rpc::Access access, const google::protobuf::Message& request,
                            T* response, ServeFn serve) {
  if (auto admitted = Admit(context, tokens, access, request); !admitted.ok()) return admitted;
  absl::StatusOr<T> result = serve();
  if (!result.ok()) return rpc::ToGrpc(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace hyscale::server
