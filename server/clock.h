// Time source of the coordinator, so tests can drive heartbeat timeouts and restart backoff.
#pragma once

#include <absl/time/clock.h>
#include <absl/time/time.h>

#include <mutex>

namespace hyscale::server {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
};

class SystemClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
};

// A clock that moves only when told to.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration by) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += by;
  }

 private:
  std::mutex mu_;
  absl::Time now_;
};

}  // namespace hyscale::server
