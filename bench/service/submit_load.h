// Phase (a): SubmitJob throughput with durable writes. Jobs ask for a GPU that no worker has, so
// none is ever placed and the measurement is the submission path alone (validation, SQLite
// insert with fsync, a scheduling pass).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/service/latency.h"
#include "hyscale/v1/job.pb.h"
#include "proto/rpc.h"

namespace hyscale::bench {

struct SubmitLoadOptions {
  int64_t submissions = 10000;
  int threads = 16;  // concurrent clients, each with one call in flight
  // Offered load in submissions/s over all threads (open loop): call i is due at i / rate and its
  // latency counts from then, so a client that falls behind shows as latency. 0: closed loop,
  // each thread submitting as soon as its last call returned.
  double rate = 0;
  std::string run_id;  // makes names and request ids unique across runs on one server
};

struct SubmitLoadResult {
  LatencyRecorder latency;  // successful calls
  double seconds = 0;       // wall time of the phase
  int64_t ok = 0;
  int64_t failed = 0;
  int64_t not_pending = 0;  // answered with a state other than PENDING (should be 0)
  std::string first_error;
  std::vector<Clock::time_point> completions;  // of successful calls, in order

  double PerSecond() const { return seconds > 0 ? static_cast<double>(ok) / seconds : 0; }
  // Submissions per second over completions [first, first + count): shows whether throughput
  // holds up as the queue of PENDING jobs grows.
  double PerSecondBetween(size_t first, size_t count) const;
};

// Thread t uses channels[t % channels.size()].
void RunSubmitLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                   const rpc::ClientOptions& client, const v1::JobSpec& spec,
                   const SubmitLoadOptions& options, SubmitLoadResult* result);

}  // namespace hyscale::bench
