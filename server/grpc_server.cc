#include "server/grpc_server.h"

#include <absl/strings/str_cat.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "server/rpc_metrics.h"

namespace hyscale::server {
namespace {

constexpr int kMaxMessageBytes = 4 << 20;
// Threads that wait for calls, at most. gRPC's default of 2 makes every thread beyond two that
// finishes a call exit, and a new one start for the next: with 64 concurrent submitters that
// churn cost a fifth of the server's CPU (bench/service, docs/performance.md section 6).
constexpr int kMaxPollers = 64;
constexpr int kKeepaliveMs = 60'000;
constexpr int kKeepaliveTimeoutMs = 20'000;

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    Coordinator* coordinator, const rpc::ServerTokens& tokens,
    std::shared_ptr<grpc::ServerCredentials> credentials, const std::string& listen,
    ServerMetrics* metrics, int streams_per_host) {
  std::unique_ptr<GrpcServer> server(new GrpcServer(coordinator, tokens, streams_per_host));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, std::move(credentials), &server->port_);
  builder.RegisterService(&server->jobs_);
  builder.RegisterService(&server->workers_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetSyncServerOption(grpc::ServerBuilder::MAX_POLLERS, kMaxPollers);
  // gRPC sets SO_REUSEPORT by default: a second coordinator on this port would then start too,
  // and clients would alternate between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A stream waits without a deadline and holds its host's slot: a client that vanished without
  // closing its connection (a machine that died) is found by our pings within about 80 s, not
  // gRPC's default of two hours, and however long its streams sat without data.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (metrics != nullptr) {
    builder.experimental().SetInterceptorCreators(RpcMetricsInterceptors(metrics));
  }
  server->streams_ = std::make_unique<StreamQueue>(builder);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot serve on ", listen, " (is the port in use?)"));
  }
  server->jobs_.ListenForStreams(server->streams_.get());
  server->workers_.ListenForStreams(server->streams_.get());
  server->streams_->Start();
  return server;
}

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  coordinator_->Shutdown();
  streams_->StopAccepting();
  server_->Shutdown(deadline);
  server_->Wait();
  streams_.reset();  // after the server, as gRPC requires: drains what the streams left
}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) Shutdown(std::chrono::system_clock::now());
}

}  // namespace hyscale::server
