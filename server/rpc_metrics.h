// A gRPC server interceptor that counts every RPC by method and status code and times it
// (hyscale_rpc_requests_total, hyscale_rpc_duration_seconds).
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

#include "server/server_metrics.h"

namespace hyscale::server {

// The interceptor factories to hand to ServerBuilder::experimental().SetInterceptorCreators.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RpcMetricsInterceptors(ServerMetrics* metrics);

// "OK", "NOT_FOUND", ... (gRPC's canonical code names).
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace hyscale::server
