#include "worker/agent/backoff.h"

#include <algorithm>

namespace hyscale::agent {

Backoff::Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max)
    : initial_(std::max(initial, std::chrono::milliseconds(1))),
      max_(std::max(max, initial_)),
      current_(initial_),
      random_(std::random_device{}()) {}

std::chrono::milliseconds Backoff::Next() {
  const auto ceiling = current_;
  current_ = std::min(current_ * 2, max_);
  std::uniform_int_distribution<long> jitter(ceiling.count() / 2, ceiling.count());
  return std::chrono::milliseconds(jitter(random_));
}

}  // namespace hyscale::agent
