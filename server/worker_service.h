// WorkerService over the Coordinator, for worker agents. Every RPC needs the full bearer token but
// ListWorkers, which the read-only one also passes.
#pragma once

#include <string>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "server/coordinator.h"
#include "server/stream_waker.h"

namespace hyscale::server {

// The assignment streams are served on gRPC's callback API, without a thread each.
class WorkerService final
    : public v1::WorkerService::WithCallbackMethod_StreamAssignments<v1::WorkerService::Service> {
 public:
  // `waker` runs the streams' wake-ups.
  WorkerService(Coordinator* coordinator, rpc::ServerTokens tokens, StreamWaker* waker)
      : coordinator_(coordinator), tokens_(std::move(tokens)), waker_(waker) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::ServerWriteReactor<v1::Assignment>* StreamAssignments(
      grpc::CallbackServerContext* context, const v1::StreamAssignmentsRequest* request) override;
  grpc::Status ReportStatus(grpc::ServerContext* context, const v1::ReportStatusRequest* request,
                            v1::ReportStatusResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  Coordinator* const coordinator_;
  const rpc::ServerTokens tokens_;
  StreamWaker* const waker_;
};

}  // namespace hyscale::server
