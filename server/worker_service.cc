#include "server/worker_service.h"

#include <utility>

#include "proto/rpc.h"
#include "server/admission.h"
#include "server/async_stream.h"

namespace hyscale::server {
grpc::Status WorkerService::RegisterWorker(grpc::ServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) {
  return AdmitThenServe(*context, tokens_, rpc::Access::kWrite, *request, response,
                        [&] { return coordinator_->RegisterWorker(*request); });
}

grpc::Status WorkerService::Heartbeat(grpc::ServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) {
  return AdmitThenServe(*context, tokens_, rpc::Access::kWrite, *request, response,
                        [&] { return coordinator_->Heartbeat(*request); });
}

void WorkerService::ListenForStreams(StreamQueue* queue) {
  ListenForStream(queue, this, &WorkerService::RequestStreamAssignments,
                  [this](grpc::ServerContext& context, const v1::StreamAssignmentsRequest& request)
                      -> absl::StatusOr<OpenedStream<v1::Assignment>> {
                    if (auto admitted = Admit(context, tokens_, rpc::Access::kWrite, request);
                        !admitted.ok()) {
                      return rpc::FromGrpc(admitted);
                    }
                    // Ends when the agent leaves, when a newer stream of the same worker replaces
                    // this one, or on shutdown (the queue is closed then).
                    auto assignments = coordinator_->OpenAssignments(request);
                    if (!assignments.ok()) return assignments.status();
                    return OpenedStream<v1::Assignment>{
                        std::make_unique<AssignmentStream>(*std::move(assignments)), nullptr};
                  });
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
  return AdmitThenServe(*context, tokens_, rpc::Access::kRead, *request, response,
                        [&] { return coordinator_->ListWorkers(*request); });
}

}  // namespace hyscale::server
