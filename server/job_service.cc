#include "server/job_service.h"

#include <utility>

#include "proto/rpc.h"
#include "server/admission.h"
#include "server/async_stream.h"

namespace hyscale::server {
namespace {

using rpc::Access;

// A read stream once its call is admitted and holds a slot of its host, else why not.
template <typename Message, typename Open>
absl::StatusOr<OpenedStream<Message>> OpenReadStream(const grpc::ServerContext& context,
                                                     const rpc::ServerTokens& tokens,
                                                     const google::protobuf::Message& request,
                                                     StreamLimiter* streams, Open open) {
  if (auto admitted = Admit(context, tokens, Access::kRead, request); !admitted.ok()) {
    return rpc::FromGrpc(admitted);
  }
  auto slot = streams->Acquire(context.peer());
  if (!slot.ok()) return slot.status();
  auto source = open();
  if (!source.ok()) return source.status();
  return OpenedStream<Message>{*std::move(source), *std::move(slot)};
}

}  // namespace

grpc::Status JobService::SubmitJob(grpc::ServerContext* context,
                                   const v1::SubmitJobRequest* request, v1::Job* response) {
  return AdmitThenServe(*context, tokens_, Access::kWrite, *request, response,
                        [&] { return coordinator_->SubmitJob(*request); });
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                v1::Job* response) {
  return AdmitThenServe(*context, tokens_, Access::kRead, *request, response,
                        [&] { return coordinator_->GetJob(request->job_id()); });
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  return AdmitThenServe(*context, tokens_, Access::kRead, *request, response,
                        [&] { return coordinator_->ListJobs(*request); });
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context,
                                   const v1::CancelJobRequest* request, v1::Job* response) {
  return AdmitThenServe(*context, tokens_, Access::kWrite, *request, response, [&] {
    return coordinator_->CancelJob(request->job_id(), request->reason());
  });
}

void JobService::ListenForStreams(StreamQueue* queue) {
  ListenForStream(queue, this, &JobService::RequestWatchJob,
                  [this](grpc::ServerContext& context, const v1::WatchJobRequest& request) {
                    return OpenReadStream<v1::JobEvent>(context, tokens_, request, &streams_, [&] {
                      return coordinator_->WatchJob(request);
                    });
                  });
  ListenForStream(queue, this, &JobService::RequestStreamLogs,
                  [this](grpc::ServerContext& context, const v1::StreamLogsRequest& request) {
                    return OpenReadStream<v1::LogChunk>(context, tokens_, request, &streams_, [&] {
                      return coordinator_->StreamLogs(request);
                    });
                  });
}

grpc::Status JobService::PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                                 v1::Plan* response) {
  return AdmitThenServe(*context, tokens_, Access::kRead, *request, response,
                        [&] { return coordinator_->PlanJob(*request); });
}

}  // namespace hyscale::server
