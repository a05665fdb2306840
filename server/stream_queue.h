// The completion queue that every server stream (WatchJob, StreamLogs, StreamAssignments) is
// served on, with the one thread that serves it: open streams hold memory, not threads. gRPC's
// async API rather than its callback API: in gRPC 1.51 the callback API's completion-queue
// threads time out after a second and sleep 100 ms, and every call of the process, the
// synchronous unary ones too, stalled with them (p99 of SubmitJob 2 ms -> 97 ms at 1,000/s).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>

namespace hyscale::server {

// What one operation on the queue does when it completes (`ok`: gRPC's success flag).
class QueueTag {
 public:
  virtual void Proceed(bool ok) = 0;

 protected:
  ~QueueTag() = default;
};

class StreamQueue {
 public:
  // Takes the queue from `builder` (before BuildAndStart).
  explicit StreamQueue(grpc::ServerBuilder& builder) : queue_(builder.AddCompletionQueue()) {}
  // Drains and stops: call after the server's Shutdown.
  ~StreamQueue();
  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;

  grpc::ServerCompletionQueue* queue() { return queue_.get(); }
  // Serves the queue on its thread (once the server is started and the streams listen).
  void Start();
  // Before the server's Shutdown: calls accepted from then on wait for no successor (asking a
  // shut-down queue for one is an error).
  void StopAccepting() { accepting_ = false; }
  bool accepting() const { return accepting_; }

 private:
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::atomic<bool> accepting_{true};
  std::thread thread_;
};

}  // namespace hyscale::server
