// What every gRPC call passes before it reaches the coordinator, shared by JobService and
// WorkerService.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include "proto/rpc.h"

namespace hyscale::server {

// OK when the call's token grants `access` and every field of `request` is within its cap
// (request_limits.h); else UNAUTHENTICATED or INVALID_ARGUMENT.
grpc::Status Admit(const grpc::ServerContextBase& context, const rpc::ServerTokens& tokens,
                   rpc::Access access, const google::protobuf::Message& request);

}  // namespace hyscale::server
