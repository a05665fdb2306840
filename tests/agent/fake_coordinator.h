// An in-process WorkerService for agent tests: records registrations, heartbeats and reports,
// and pushes assignments the test queues. Restartable on the same port to play a coordinator
// that goes away and comes back with no memory of its workers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "hyscale/v1/service.grpc.pb.h"

namespace hyscale::agent::testing {

class FakeWorkerService final : public v1::WorkerService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    registrations_.push_back(*request);
    known_.insert(request->name());
    response->set_worker_id(request->name());
    response->set_heartbeat_interval_ms(100);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeats_.push_back(*request);
    response->set_registered(known_.count(request->worker_id()) > 0);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status StreamAssignments(grpc::ServerContext* context, const v1::StreamAssignmentsRequest*,
                                 grpc::ServerWriter<v1::Assignment>* writer) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++open_streams_;
    cv_.notify_all();
    while (!closing_ && !context->IsCancelled()) {
      if (assignments_.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      v1::Assignment next = assignments_.front();
      assignments_.pop_front();
      lock.unlock();
      const bool written = writer->Write(next);
      lock.lock();
      if (!written) break;
    }
    --open_streams_;
    return {grpc::StatusCode::UNAVAILABLE, "fake coordinator closing"};
  }

  grpc::Status ReportStatus(grpc::ServerContext*, const v1::ReportStatusRequest* request,
                            v1::ReportStatusResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (known_.count(request->worker_id()) == 0) {
      return {grpc::StatusCode::NOT_FOUND, "unknown worker"};
    }
    for (const auto& report : request->reports()) reports_.push_back(report);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // Test side.
  void Push(const v1::Assignment& assignment) {
    std::lock_guard<std::mutex> lock(mu_);
    assignments_.push_back(assignment);
    cv_.notify_all();
  }
  void Forget(const std::string& worker) {
    std::lock_guard<std::mutex> lock(mu_);
    known_.erase(worker);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_all();
  }
  // Waits until `ready` (called under the lock) holds.
  bool WaitUntil(const std::function<bool()>& ready,
                 std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, ready);
  }
  std::vector<v1::RankReport> reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  std::vector<v1::RegisterWorkerRequest> registrations() {
    std::lock_guard<std::mutex> lock(mu_);
    return registrations_;
  }

  // For WaitUntil predicates (the lock is held there).
  const std::vector<v1::RankReport>& reports_locked() const { return reports_; }
  const std::vector<v1::RegisterWorkerRequest>& registrations_locked() const {
    return registrations_;
  }
  int open_streams_locked() const { return open_streams_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::RegisterWorkerRequest> registrations_;
  std::vector<v1::HeartbeatRequest> heartbeats_;
  std::vector<v1::RankReport> reports_;
  std::deque<v1::Assignment> assignments_;
  std::set<std::string> known_;
  int open_streams_ = 0;
  bool closing_ = false;
};

// A gRPC server around a FakeWorkerService on 127.0.0.1.
class FakeCoordinator {
 public:
  // port 0 picks a free one.
  explicit FakeCoordinator(int port = 0) {
    service_ = std::make_unique<FakeWorkerService>();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
  }
  ~FakeCoordinator() { Stop(); }

  void Stop() {
    if (!server_) return;
    service_->Close();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeWorkerService& service() { return *service_; }

 private:
  std::unique_ptr<FakeWorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace hyscale::agent::testing
