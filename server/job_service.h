// JobService over the Coordinator: the gRPC boundary (auth, status mapping, streaming).
// Submit and Cancel need the full bearer token; reads (Get, List, Watch, StreamLogs, Plan) the
// full or the read-only one.
#pragma once

#include <string>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "server/coordinator.h"

namespace hyscale::server {

class JobService final : public v1::JobService::Service {
 public:
  // No full token turns auth off.
  JobService(Coordinator* coordinator, rpc::ServerTokens tokens)
      : coordinator_(coordinator), tokens_(std::move(tokens)) {}

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
  const rpc::ServerTokens tokens_;
};

}  // namespace hyscale::server
