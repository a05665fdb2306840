// What the load phases share: channels to the coordinator, the benchmark's job spec, and a count
// of asynchronous calls still in flight.
#pragma once

#include <absl/status/statusor.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hyscale/v1/job.pb.h"
#include "proto/rpc.h"

namespace hyscale::bench {

// `count` channels to `options.server`, each on its own TCP connection (a local subchannel
// pool), so load spreads over connections the way separate agents and CLIs would.
absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> OpenChannels(
    const rpc::ClientOptions& options, int count);

// A tiny valid recall job (the coordinator validates every submission); callers name each copy.
absl::StatusOr<v1::JobSpec> BenchSpec();

// Calls started and not yet completed; Wait() blocks until none are left. Every call has a
// deadline, so Wait() ends.
class InFlight {
 public:
  void Begin();
  void End();
  void Wait();

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t count_ = 0;
};

}  // namespace hyscale::bench
