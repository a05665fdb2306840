// Phase (b): many simulated workers against one coordinator. Each registers (one CPU slot by
// default), heartbeats at the interval the coordinator hands out, holds an assignment stream and
// acts as an agent would: a RunRank is reported started at once and exited 0 after job_ms. Jobs
// that fit those workers are submitted at a fixed rate (open loop) while it all runs.
//
// Measured: RegisterWorker, Heartbeat, ReportStatus and SubmitJob latency; scheduling latency
// (submit -> SCHEDULED: the SubmitJob answer when it already says SCHEDULED, else the RunRank's
// arrival); and submit -> RunRank at the worker.
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

struct WorkerLoadOptions {
  int workers = 1000;
  int slots = 1;              // CPU slots per worker
  int register_threads = 16;  // concurrent RegisterWorker calls
  double job_rate = 20;       // submissions per second
  int64_t job_ms = 5000;      // how long a simulated rank runs
  double duration_s = 30;     // submission window (after every worker registered)
  std::string run_id;         // makes worker and job names unique across runs on one server
};

struct WorkerLoadResult {
  LatencyRecorder register_latency;
  LatencyRecorder heartbeat;         // beats started in the submission window (steady state)
  LatencyRecorder first_heartbeats;  // beats started before it, while streams open
  LatencyRecorder report;            // ReportStatus (rank started / exited)
  LatencyRecorder submit;            // SubmitJob
  LatencyRecorder scheduled;         // submit -> SCHEDULED
  LatencyRecorder delivered;         // submit -> RunRank on the worker's stream
  int64_t heartbeat_interval_ms = 0;
  int64_t registered = 0;
  int64_t register_failed = 0;
  int64_t heartbeats_failed = 0;
  int64_t heartbeats_unregistered = 0;  // answered registered=false: the worker was lost
  int64_t reports_failed = 0;
  int64_t submitted = 0;
  int64_t submit_failed = 0;
  int64_t placed_at_submit = 0;  // SubmitJob already answered SCHEDULED
  int64_t never_scheduled = 0;   // accepted but neither SCHEDULED nor delivered by the end
  int64_t streams_failed = 0;    // assignment streams that ended before the phase did
  int64_t stops_received = 0;    // StopRank or a heartbeat's stop list (should be 0)
  double seconds = 0;            // the submission window as it ran
  std::string first_error;
};

// Workers use channels round robin.
void RunWorkerLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                   const rpc::ClientOptions& client, const v1::JobSpec& spec,
                   const WorkerLoadOptions& options, WorkerLoadResult* result);

}  // namespace hyscale::bench
