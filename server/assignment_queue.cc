#include "server/assignment_queue.h"

#include <utility>

namespace hyscale::server {

void AssignmentQueue::Push(v1::Assignment assignment) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  items_.push_back(std::move(assignment));
  WakeDrainer();
}

bool AssignmentQueue::Drain(std::vector<v1::Assignment>* out, std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return true;  // what is left goes to the stream that replaced this one
  for (auto& item : items_) out->push_back(std::move(item));
  items_.clear();
  if (out->empty()) wake_ = std::move(wake);
  return false;
}

void AssignmentQueue::ClearWake() {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = nullptr;
}

void AssignmentQueue::WakeDrainer() {
  if (!wake_) return;
  std::function<void()> wake = std::move(wake_);
  wake_ = nullptr;
  wake();
}

void AssignmentQueue::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  WakeDrainer();
}

std::optional<absl::Status> AssignmentStream::Pull(std::vector<v1::Assignment>* out,
                                                   std::function<void()> wake) {
  // Ends when a newer stream of the same worker replaced this one, or on shutdown.
  if (queue_->Drain(out, std::move(wake))) {
    return absl::UnavailableError("assignment stream closed: reopen it");
  }
  return std::nullopt;
}

}  // namespace hyscale::server
