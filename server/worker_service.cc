#include "server/worker_service.h"

#include <utility>

#include "proto/rpc.h"
#include "server/admission.h"

namespace hyscale::server {
namespace {

// How long an idle assignment stream waits before re-checking for a departed agent.
constexpr absl::Duration kAssignmentPoll = absl::Milliseconds(200);

}  // namespace

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

grpc::Status WorkerService::StreamAssignments(grpc::ServerContext* context,
                                              const v1::StreamAssignmentsRequest* request,
                                              grpc::ServerWriter<v1::Assignment>* writer) {
  if (auto admitted = Admit(*context, tokens_, rpc::Access::kWrite, *request); !admitted.ok()) {
    return admitted;
  }
  auto queue = coordinator_->OpenAssignments(*request);
  if (!queue.ok()) return rpc::ToGrpc(queue.status());
  // Ends when the agent leaves, when a newer stream of the same worker replaces this one, or on
  // shutdown (the queue is closed then).
  while (!context->IsCancelled() && !(*queue)->closed()) {
    auto assignment = (*queue)->Pop(kAssignmentPoll);
    if (assignment && !writer->Write(*assignment)) break;
  }
  if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "stream cancelled"};
  return {grpc::StatusCode::UNAVAILABLE, "assignment stream closed: reopen it"};
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
