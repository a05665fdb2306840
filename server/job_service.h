// JobService over the Coordinator: the gRPC boundary (auth, status mapping, streaming).
// Submit and Cancel need the full bearer token; reads (Get, List, Watch, StreamLogs, Plan) the
// full or the read-only one. Every request passes the field size caps (request_limits.h).
#pragma once

#include <string>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "server/coordinator.h"
#include "server/stream_limiter.h"
#include "server/stream_queue.h"

namespace hyscale::server {

// Watch and log streams are served on the StreamQueue (gRPC's async API), without a thread each.
class JobService final : public v1::JobService::WithAsyncMethod_WatchJob<
                             v1::JobService::WithAsyncMethod_StreamLogs<v1::JobService::Service>> {
 public:
  // No full token turns auth off. A host may hold `streams_per_host` watch and log streams.
  JobService(Coordinator* coordinator, rpc::ServerTokens tokens, int streams_per_host)
      : coordinator_(coordinator), tokens_(std::move(tokens)), streams_(streams_per_host) {}

  // Serves WatchJob and StreamLogs on `queue` (once the server has started).
  void ListenForStreams(StreamQueue* queue);

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                       v1::Plan* response) override;

 private:
  Coordinator* const coordinator_;
  const rpc::ServerTokens tokens_;
  StreamLimiter streams_;
};

}  // namespace hyscale::server
