// Exponential backoff with jitter for reconnecting to the coordinator: many agents that lost the
// same coordinator must not all come back in the same instant.
#pragma once

#include <chrono>
#include <random>

namespace hyscale::agent {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max);

  // The next wait: uniformly random in [d/2, d] where d doubles from `initial` up to `max`.
  std::chrono::milliseconds Next();
  void Reset() { current_ = initial_; }

 private:
  const std::chrono::milliseconds initial_;
  const std::chrono::milliseconds max_;
  std::chrono::milliseconds current_;
  std::mt19937_64 random_;
};

}  // namespace hyscale::agent
