#include "server/worker_service.h"

#include <utility>

#include "proto/rpc.h"
#include "server/admission.h"
#include "server/stream_reactor.h"

namespace hyscale::server {
grpc::Status WorkerService::RegisterWorker(grpc::ServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) {
  if (auto admitted = Admit(*context, tokens_, rpc::Access::kWrite, *request); !admitted.ok()) {
    return admitted;
  }
  auto result = coordinator_->RegisterWorker(*request);
  if (!result.ok()) return rpc::ToGrpc(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Heartbeat(grpc::ServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) {
  if (auto admitted = Admit(*context, tokens_, rpc::Access::kWrite, *request); !admitted.ok()) {
    return admitted;
  }
  auto result = coordinator_->Heartbeat(*request);
  if (!result.ok()) return rpc::ToGrpc(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<v1::Assignment>* WorkerService::StreamAssignments(
    grpc::CallbackServerContext* context, const v1::StreamAssignmentsRequest* request) {
  using Reactor = StreamReactor<v1::Assignment>;
  if (auto admitted = Admit(*context, tokens_, rpc::Access::kWrite, *request); !admitted.ok()) {
    return Reactor::Start(rpc::FromGrpc(admitted), waker_);
  }
  auto queue = coordinator_->OpenAssignments(*request);
  if (!queue.ok()) return Reactor::Start(queue.status(), waker_);
  return Reactor::Start(std::make_unique<AssignmentStream>(*std::move(queue)), waker_);
}

grpc::Status WorkerService::ReportStatus(grpc::ServerContext* context,
                                         const v1::ReportStatusRequest* request,
                                         v1::ReportStatusResponse*) {
  if (auto admitted = Admit(*context, tokens_, rpc::Access::kWrite, *request); !admitted.ok()) {
    return admitted;
  }
  return rpc::ToGrpc(coordinator_->ReportStatus(*request));
}

grpc::Status WorkerService::ListWorkers(grpc::ServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) {
  if (auto admitted = Admit(*context, tokens_, rpc::Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  auto listed = coordinator_->ListWorkers(*request);
  if (!listed.ok()) return rpc::ToGrpc(listed.status());
  *response = std::move(*listed);
  return grpc::Status::OK;
}

}  // namespace hyscale::server
