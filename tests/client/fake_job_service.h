// In-process JobService and WorkerService for CLI tests: jobs in memory, small pages (so `list`
// must follow page tokens), scripted watch events and logs, optional bearer token.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"

namespace hyscale::cli::testing {

class FakeJobService final : public v1::JobService::Service {
 public:
  explicit FakeJobService(std::string token) : token_(std::move(token)) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override {
    if (auto status = rpc::CheckToken(*context, {token_, ""}, rpc::Access::kWrite); !status.ok())
      return status;
    std::lock_guard<std::mutex> lock(mu_);
    submissions_.push_back(*request);
    if (request->request_id().empty()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "request_id: required"};
    }
    for (const auto& job : jobs_) {
      if (job.request_id() == request->request_id()) {
        *response = job;
        return grpc::Status::OK;
      }
    }
    v1::Job job;
    job.set_id("job-" + std::to_string(jobs_.size() + 1));
    job.set_name(request->spec().name());
    *job.mutable_spec() = request->spec();
    *job.mutable_resources() = request->resources();
    job.set_priority(request->priority());
    job.set_max_restarts(request->max_restarts());
    job.set_state(v1::JOB_STATE_PENDING);
    job.set_request_id(request->request_id());
    job.mutable_created_at()->set_seconds(1700000000);
    jobs_.push_back(job);
    *response = job;
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    const v1::Job* job = Find(request->job_id());
    if (job == nullptr)
      return {grpc::StatusCode::NOT_FOUND, "job " + request->job_id() + " not found"};
    *response = *job;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::Job> matching;
    for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
      bool wanted = request->states().empty();
      for (int state : request->states()) wanted |= state == it->state();
      if (wanted) matching.push_back(*it);
    }
    const size_t start = request->page_token().empty() ? 0 : std::stoul(request->page_token());
    for (size_t i = start; i < matching.size() && i < start + kPageSize; ++i) {
      *response->add_jobs() = matching[i];
    }
    if (start + kPageSize < matching.size()) {
      response->set_next_page_token(std::to_string(start + kPageSize));
    }
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override {
    if (auto status = rpc::CheckToken(*context, {token_, ""}, rpc::Access::kWrite); !status.ok())
      return status;
    std::lock_guard<std::mutex> lock(mu_);
    v1::Job* job = Find(request->job_id());
    if (job == nullptr)
      return {grpc::StatusCode::NOT_FOUND, "job " + request->job_id() + " not found"};
    if (job->state() == v1::JOB_STATE_SUCCEEDED) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "job " + job->id() + " already succeeded"};
    }
    job->set_state(v1::JOB_STATE_CANCELLED);
    job->set_reason(request->reason().empty() ? "cancelled" : request->reason());
    *response = *job;
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    std::vector<v1::JobEvent> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (Find(request->job_id()) == nullptr) return {grpc::StatusCode::NOT_FOUND, "no such job"};
      events = events_[request->job_id()];
    }
    for (const auto& event : events) {
      if (event.sequence() > request->after_sequence()) writer->Write(event);
    }
    return grpc::Status::OK;
  }

  grpc::Status StreamLogs(grpc::ServerContext*, const v1::StreamLogsRequest* request,
                          grpc::ServerWriter<v1::LogChunk>* writer) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (Find(request->job_id()) == nullptr) return {grpc::StatusCode::NOT_FOUND, "no such job"};
    for (const std::string& piece :
         {std::string("line one\n"),
          std::string("rank ") + std::to_string(request->rank()) + "\n"}) {
      v1::LogChunk chunk;
      chunk.set_rank(request->rank());
      chunk.set_data(piece);
      writer->Write(chunk);
    }
    return grpc::Status::OK;
  }

  grpc::Status PlanJob(grpc::ServerContext*, const v1::PlanJobRequest* request,
                       v1::Plan* response) override {
    response->set_feasible(true);
    response->set_ranks(std::max(1, request->resources().ranks()));
    response->set_context_parallel(1);
    response->set_cp_layout("none");
    response->set_query_group(4);
    response->set_memory_bytes_per_rank(int64_t{3} << 30);
    response->add_notes("fake planner");
    return grpc::Status::OK;
  }

  // Test side.
  void SetEvents(const std::string& job_id, std::vector<v1::JobEvent> events) {
    std::lock_guard<std::mutex> lock(mu_);
    events_[job_id] = std::move(events);
  }
  void SetState(const std::string& job_id, v1::JobState state) {
    std::lock_guard<std::mutex> lock(mu_);
    Find(job_id)->set_state(state);
  }
  void SetRestarts(const std::string& job_id, int restarts, int start_timeouts, int disruptions) {
    std::lock_guard<std::mutex> lock(mu_);
    v1::Job* job = Find(job_id);
    job->set_restarts(restarts);
    job->set_start_timeouts(start_timeouts);
    job->set_disruptions(disruptions);
  }
  void SetRendezvous(const std::string& job_id, const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    Find(job_id)->set_rendezvous(address);
  }
  std::vector<v1::SubmitJobRequest> submissions() {
    std::lock_guard<std::mutex> lock(mu_);
    return submissions_;
  }

 private:
  static constexpr size_t kPageSize = 2;

  v1::Job* Find(const std::string& id) {
    for (auto& job : jobs_) {
      if (job.id() == id) return &job;
    }
    return nullptr;
  }

  const std::string token_;
  std::mutex mu_;
  std::vector<v1::Job> jobs_;
  std::vector<v1::SubmitJobRequest> submissions_;
  std::map<std::string, std::vector<v1::JobEvent>> events_;
};

class FakeWorkers final : public v1::WorkerService::Service {
 public:
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    v1::WorkerInfo* worker = response->add_workers();
    worker->set_id("worker-a");
    worker->set_address("10.0.0.7");
    worker->set_state(v1::WORKER_STATE_ONLINE);
    v1::Device* device = worker->add_devices();
    device->set_name("cpu");
    device->set_kind(v1::DEVICE_KIND_CPU);
    device->set_count(2);
    device->set_memory_bytes(int64_t{8} << 30);
    v1::RankRef* ref = worker->add_running();
    ref->set_job_id("job-1");
    ref->set_rank(0);
    return grpc::Status::OK;
  }
};

class FakeServer {
 public:
  explicit FakeServer(const std::string& token = "") : jobs_(token) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&workers_);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeJobService& jobs() { return jobs_; }

 private:
  FakeJobService jobs_;
  FakeWorkers workers_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace hyscale::cli::testing
