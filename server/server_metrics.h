// The coordinator's metrics (DESIGN.md section 6): job and worker counts, submissions,
// scheduling latency, RPCs, and per running job its step-time breakdown and progress. A job's
// series are dropped a while after it ends, so the job_id label stays bounded (not `job`:
// Prometheus keeps that name for the scrape job).
#pragma once

#include <absl/time/time.h>

#include <map>
#include <mutex>
#include <string>

#include "hyscale/v1/service.pb.h"
#include "server/metrics.h"

namespace hyscale::server {

class ServerMetrics {
 public:
  // `retention`: how long a finished job's series stay exported.
  explicit ServerMetrics(absl::Duration retention);

  void SetJobCounts(const std::map<v1::JobState, int>& counts);
  void SetWorkerCounts(const std::map<v1::WorkerState, int>& counts);
  void JobSubmitted();
  void JobScheduled(double latency_seconds);  // PENDING -> SCHEDULED
  // Rank 0's step event. Phases: only the trainer's (IsPhaseName), so a worker making names up
  // cannot grow the series.
  void Step(const std::string& job_id, const v1::TrainerEventLine::Step& step);
  // The predicted peak memory of one rank and step time (planner::PredictFitted on the job's
  // profile; 0 when unknown), beside the measured ones.
  void JobPlanned(const std::string& job_id, int64_t predicted_memory_bytes,
                  double predicted_step_seconds);
  // Rank 0's trainer starting a stage: the stage's own predictions replace the job's (its memory
  // as the trainer predicts it for the stage's shape and query chunk on the memory its device has;
  // its step time as the planner predicts the stage's own workload: a dense warm-up's step is not
  // the sparse stage's). A step time of 0 (unknown) leaves the job's.
  void StagePredicted(const std::string& job_id, int64_t predicted_memory_bytes,
                      double predicted_step_seconds);
  // A non-terminal state the job entered (or was loaded in): whether it is RUNNING, so alerts on
  // a stalled step counter do not fire for jobs that wait, restart or ended. PENDING jobs get no
  // series: every queued job would add some.
  void JobState(const std::string& job_id, v1::JobState state);
  void JobRestarted(const std::string& job_id);
  void JobEnded(const std::string& job_id, absl::Time when);
  // Drops the series of jobs that ended more than `retention` before `now`.
  void Expire(absl::Time now);
  void Rpc(const std::string& method, const std::string& code, double seconds);

  std::string Render() const { return registry_.Render(); }

 private:
  const absl::Duration retention_;
  MetricsRegistry registry_;
  Gauge* jobs_;
  Counter* submissions_;
  Histogram* scheduling_latency_;
  Counter* rpc_requests_;
  Histogram* rpc_duration_;
  Gauge* workers_;
  Histogram* step_phase_;
  Histogram* comm_seconds_;
  Histogram* step_seconds_;
  Gauge* tokens_per_second_;
  Gauge* loss_;
  Gauge* indexer_recall_;
  Gauge* key_sharing_;
  Gauge* peak_memory_;
  Gauge* step_;
  Gauge* running_;
  Counter* restarts_;
  Gauge* predicted_memory_;
  Gauge* predicted_step_;

  std::mutex mu_;
  std::map<std::string, absl::Time> ended_;  // job id -> when it ended
};

}  // namespace hyscale::server
