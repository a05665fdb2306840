// JobService over the Coordinator: the gRPC boundary (auth, status mapping, streaming).
// Submit and Cancel need the bearer token; reads are open.
#pragma once

#include <string>

#include "hyscale/v1/service.grpc.pb.h"
#include "server/coordinator.h"

namespace hyscale::server {

class JobService final : public v1::JobService::Service {
 public:
  // `token`: the expected bearer token; empty turns auth off.
  JobService(Coordinator* coordinator, std::string token)
      : coordinator_(coordinator), token_(std::move(token)) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status StreamLogs(grpc::ServerContext* context, const v1::StreamLogsRequest* request,
                          grpc::ServerWriter<v1::LogChunk>* writer) override;
  grpc::Status PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                       v1::Plan* response) override;

 private:
  Coordinator* const coordinator_;
  const std::string token_;
};

}  // namespace hyscale::server
