#include "server/assignment_queue.h"

#include <utility>

namespace hyscale::server {

void AssignmentQueue::Push(v1::Assignment assignment) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    items_.push_back(std::move(assignment));
  }
  ready_.notify_all();
}

std::optional<v1::Assignment> AssignmentQueue::Pop(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                  [&] { return closed_ || !items_.empty(); });
  if (closed_ || items_.empty()) return std::nullopt;
  v1::Assignment next = std::move(items_.front());
  items_.pop_front();
  return next;
}

void AssignmentQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  ready_.notify_all();
}

bool AssignmentQueue::closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace hyscale::server
