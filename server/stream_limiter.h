// Caps the streams (WatchJob, StreamLogs) one client host holds open at once: each holds memory
// (about 16 KiB) and a store read per wake-up for as long as it lasts, so one client could
// otherwise take them all.
#pragma once

#include <absl/status/statusor.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace hyscale::server {

inline constexpr int kDefaultStreamsPerHost = 128;

class StreamLimiter {
 public:
  explicit StreamLimiter(int per_host) : per_host_(per_host) {}

  // Held for the life of a stream; the slot is free again once it is destroyed.
  class Slot {
   public:
    Slot(StreamLimiter* limiter, std::string host) : limiter_(limiter), host_(std::move(host)) {}
    ~Slot() { limiter_->Release(host_); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    StreamLimiter* const limiter_;
    const std::string host_;
  };

  // A slot for a stream from `peer` (gRPC's "ipv4:127.0.0.1:5555": the port is left out, one
  // host opens many connections), or RESOURCE_EXHAUSTED when it holds per_host already.
  absl::StatusOr<std::unique_ptr<Slot>> Acquire(const std::string& peer);

 private:
  void Release(const std::string& host);

  const int per_host_;
  std::mutex mu_;
  std::map<std::string, int> open_;  // streams per host, only hosts with some open
};

}  // namespace hyscale::server
