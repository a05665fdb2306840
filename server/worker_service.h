// WorkerService over the Coordinator, for worker agents. Every RPC needs the full bearer token but
// ListWorkers, which the read-only one also passes.
#pragma once

#include <string>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "server/coordinator.h"
#include "server/stream_queue.h"

namespace hyscale::server {

// The assignment streams are served on the StreamQueue (gRPC's async API), without a thread each.
class WorkerService final
    : public v1::WorkerService::WithAsyncMethod_StreamAssignments<v1::WorkerService::Service> {
 public:
  WorkerService(Coordinator* coordinator, rpc::ServerTokens tokens)
      : coordinator_(coordinator), tokens_(std::move(tokens)) {}

  // Serves StreamAssignments on `queue` (once the server has started).
  void ListenForStreams(StreamQueue* queue);

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ReportStatus(grpc::ServerContext* context, const v1::ReportStatusRequest* request,
                            v1::ReportStatusResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  Coordinator* const coordinator_;
  const rpc::ServerTokens tokens_;
};

}  // namespace hyscale::server
