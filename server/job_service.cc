#include "server/job_service.h"

#include <utility>

#include "proto/rpc.h"
#include "server/admission.h"
#include "server/stream_reactor.h"

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

// A stream's source once the call is admitted and holds a slot of its host, else why not.
template <typename Message, typename Open>
grpc::ServerWriteReactor<Message>* Serve(const grpc::CallbackServerContext& context,
                                         const rpc::ServerTokens& tokens,
                                         const google::protobuf::Message& request,
                                         StreamLimiter* streams, StreamWaker* waker, Open open) {
  using Reactor = StreamReactor<Message>;
  if (auto admitted = Admit(context, tokens, Access::kRead, request); !admitted.ok()) {
    return Reactor::Start(rpc::FromGrpc(admitted), waker);
  }
  auto slot = streams->Acquire(context.peer());
  if (!slot.ok()) return Reactor::Start(slot.status(), waker);
  return Reactor::Start(open(), waker, *std::move(slot));
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

grpc::ServerWriteReactor<v1::JobEvent>* JobService::WatchJob(grpc::CallbackServerContext* context,
                                                             const v1::WatchJobRequest* request) {
  return Serve<v1::JobEvent>(*context, tokens_, *request, &streams_, waker_,
                             [&] { return coordinator_->WatchJob(*request); });
}

grpc::ServerWriteReactor<v1::LogChunk>* JobService::StreamLogs(
    grpc::CallbackServerContext* context, const v1::StreamLogsRequest* request) {
  return Serve<v1::LogChunk>(*context, tokens_, *request, &streams_, waker_,
                             [&] { return coordinator_->StreamLogs(*request); });
}

grpc::Status JobService::PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                                 v1::Plan* response) {
  if (auto admitted = Admit(*context, tokens_, Access::kRead, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(coordinator_->PlanJob(*request), response);
}

}  // namespace hyscale::server
