// Phase (c): many concurrent WatchJob streams (on the client's async API, one thread for all).
// `jobs` jobs that are never placed are submitted and `watchers` streams opened on them, spread
// over the channels (HTTP/2 streams share connections as CLIs behind one proxy would); once every
// stream has its snapshot, the caller measures the coordinator, then every job is cancelled and
// each stream must deliver the CANCELLED event and end cleanly.
//
// Measured: the time to open them all, and the fan-out latency from CancelJob's call to each
// watcher's CANCELLED event.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/service/latency.h"
#include "hyscale/v1/job.pb.h"
#include "proto/rpc.h"

namespace hyscale::bench {

struct WatchLoadOptions {
  int64_t watchers = 10000;
  int jobs = 100;
  std::string run_id;  // makes job names unique across runs on one server
};

struct WatchLoadResult {
  int64_t opened = 0;     // streams that delivered their snapshot
  int64_t cancelled = 0;  // streams that delivered the CANCELLED event
  int64_t ended_ok = 0;   // streams that then ended with OK
  int64_t failed = 0;     // streams that ended otherwise, or calls that failed
  std::string first_error;
  double open_seconds = 0;  // from the first stream started to the last snapshot
  LatencyRecorder fanout;   // CancelJob called -> CANCELLED event at a watcher
};

// Calls `when_open` once every stream has its snapshot (or the opening timed out), before
// cancelling the jobs.
void RunWatchLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                  const rpc::ClientOptions& client, const v1::JobSpec& spec,
                  const WatchLoadOptions& options, const std::function<void()>& when_open,
                  WatchLoadResult* result);

}  // namespace hyscale::bench
