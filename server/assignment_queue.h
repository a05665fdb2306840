// The assignments waiting for one worker's StreamAssignments call. A new stream replaces (closes)
// the previous queue; pushes to a closed queue are dropped, because a reopened stream re-sends
// every rank still wanted and heartbeats repeat every stop.
#pragma once

#include <absl/time/time.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "hyscale/v1/service.pb.h"

namespace hyscale::server {

class AssignmentQueue {
 public:
  void Push(v1::Assignment assignment);
  // The next assignment, or nullopt after `timeout` or once closed.
  std::optional<v1::Assignment> Pop(absl::Duration timeout);
  void Close();
  bool closed();

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<v1::Assignment> items_;
  bool closed_ = false;
};

}  // namespace hyscale::server
