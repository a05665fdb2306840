// hyscaled's gRPC server: JobService, WorkerService, grpc.health.v1, reflection and the RPC
// metrics interceptor on one port. Shared by main and the service tests, so both run the same
// setup.
#pragma once

#include <absl/status/statusor.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "server/coordinator.h"
#include "server/job_service.h"
#include "server/server_metrics.h"
#include "server/stream_queue.h"
#include "server/worker_service.h"

namespace hyscale::server {

class GrpcServer {
 public:
  // Serves on `listen` (HOST:PORT, port 0: any free port). No full token: auth off. `metrics`
  // may be null.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      Coordinator* coordinator, const rpc::ServerTokens& tokens,
      std::shared_ptr<grpc::ServerCredentials> credentials, const std::string& listen,
      ServerMetrics* metrics, int streams_per_host = kDefaultStreamsPerHost);

  int port() const { return port_; }
  // Ends the coordinator's streams, then gives in-flight calls until `deadline`.
  void Shutdown(std::chrono::system_clock::time_point deadline);
  ~GrpcServer();  // Shutdown() now, if not done

 private:
  GrpcServer(Coordinator* coordinator, const rpc::ServerTokens& tokens, int streams_per_host)
      : coordinator_(coordinator),
        jobs_(coordinator, tokens, streams_per_host),
        workers_(coordinator, tokens) {}

  Coordinator* const coordinator_;
  JobService jobs_;
  WorkerService workers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<StreamQueue> streams_;  // stopped after the server
  bool shut_down_ = false;
  int port_ = 0;
};

}  // namespace hyscale::server
