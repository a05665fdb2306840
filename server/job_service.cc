#include "server/job_service.h"

#include <utility>

#include "proto/rpc.h"
#include "server/admission.h"

namespace hyscale::server {
namespace {

using rpc::Access;

// Copies a successful result into the response, or maps the error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return rpc::ToGrpc(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobService::SubmitJob(grpc::ServerContext* context,
                                   const v1::SubmitJobRequest* request, v1::Job* response) {
  if (auto admitted = Admit(*context, tokens_, Access::kWrite, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(coordinator_->SubmitJob(*request), response);
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                v1::Job* response) {
  if (auto admitted = Admit(*context, tokens_, Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(coordinator_->GetJob(request->job_id()), response);
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  if (auto admitted = Admit(*context, tokens_, Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(coordinator_->ListJobs(*request), response);
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context,
                                   const v1::CancelJobRequest* request, v1::Job* response) {
  if (auto admitted = Admit(*context, tokens_, Access::kWrite, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(coordinator_->CancelJob(request->job_id(), request->reason()), response);
}

grpc::Status JobService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::JobEvent>* writer) {
  if (auto admitted = Admit(*context, tokens_, Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  auto slot = streams_.Acquire(context->peer());
  if (!slot.ok()) return rpc::ToGrpc(slot.status());
  return rpc::ToGrpc(coordinator_->WatchJob(
      *request, [&](const v1::JobEvent& event) { return writer->Write(event); },
      [&] { return context->IsCancelled(); }));
}

grpc::Status JobService::StreamLogs(grpc::ServerContext* context,
                                    const v1::StreamLogsRequest* request,
                                    grpc::ServerWriter<v1::LogChunk>* writer) {
  if (auto admitted = Admit(*context, tokens_, Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  auto slot = streams_.Acquire(context->peer());
  if (!slot.ok()) return rpc::ToGrpc(slot.status());
  return rpc::ToGrpc(coordinator_->StreamLogs(
      *request, [&](const v1::LogChunk& chunk) { return writer->Write(chunk); },
      [&] { return context->IsCancelled(); }));
}

grpc::Status JobService::PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                                 v1::Plan* response) {
  if (auto admitted = Admit(*context, tokens_, Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(coordinator_->PlanJob(*request), response);
}

}  // namespace hyscale::server
