// The assignments waiting for one worker's StreamAssignments call. A new stream replaces (closes)
// the previous queue; pushes to a closed queue are dropped, because a reopened stream re-sends
// every rank still wanted and heartbeats repeat every stop.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "hyscale/v1/service.pb.h"
#include "server/stream_source.h"

namespace hyscale::server {

class AssignmentQueue {
 public:
  void Push(v1::Assignment assignment);
  // Moves every waiting assignment to `out` and returns false; when there is none, calls `wake`
  // once at the next Push or Close. Closed: true, and nothing moved.
  bool Drain(std::vector<v1::Assignment>* out, std::function<void()> wake);
  // No wake set by Drain runs after it returns.
  void ClearWake();
  void Close();

 private:
  // Called with mu_ held.
  void WakeDrainer();

  std::mutex mu_;
  std::deque<v1::Assignment> items_;
  std::function<void()> wake_;
  bool closed_ = false;
};

// A StreamAssignments call: what its queue holds, as it arrives, until the queue is closed.
class AssignmentStream final : public StreamSource<v1::Assignment> {
 public:
  explicit AssignmentStream(std::shared_ptr<AssignmentQueue> queue) : queue_(std::move(queue)) {}
  ~AssignmentStream() override { queue_->ClearWake(); }
  std::optional<absl::Status> Pull(std::vector<v1::Assignment>* out,
                                   std::function<void()> wake) override;

 private:
  const std::shared_ptr<AssignmentQueue> queue_;
};

}  // namespace hyscale::server
