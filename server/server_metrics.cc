#include "server/server_metrics.h"

#include <absl/strings/str_cat.h>

#include <cctype>

#include "proto/constants.h"
#include "proto/events.h"

namespace hyscale::server {
namespace {

// Step times span a millisecond (tiny CPU models) to minutes (large models), so the default
// request-latency buckets would put everything in one bucket.
std::vector<double> StepBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1,     2.5,    5,     10,   30,    60,   120, 300,  600};
}

std::vector<double> RpcBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> SchedulingBuckets() {
  return {0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400};
}

std::string StateLabel(const std::string& enum_name, size_t prefix) {
  std::string label = enum_name.substr(prefix);
  for (char& c : label) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return label;
}

}  // namespace

ServerMetrics::ServerMetrics(absl::Duration retention)
    : retention_(retention),
      jobs_(registry_.AddGauge("hyscale_jobs", "Jobs by state.", {"state"})),
      submissions_(registry_.AddCounter("hyscale_job_submissions_total", "Jobs submitted.")),
      scheduling_latency_(registry_.AddHistogram("hyscale_scheduling_latency_seconds",
                                                 "Time from PENDING to SCHEDULED.", {},
                                                 SchedulingBuckets())),
      rpc_requests_(registry_.AddCounter("hyscale_rpc_requests_total",
                                         "gRPC requests by method and status code.",
                                         {"method", "code"})),
      rpc_duration_(registry_.AddHistogram("hyscale_rpc_duration_seconds",
                                           "gRPC request handling time (streams: whole stream).",
                                           {"method"}, RpcBuckets())),
      workers_(registry_.AddGauge("hyscale_workers", "Workers by state.", {"state"})),
      step_phase_(registry_.AddHistogram("hyscale_job_step_phase_seconds",
                                         "Time per training step phase (rank 0).",
                                         {"job_id", "phase"}, StepBuckets())),
      comm_seconds_(registry_.AddHistogram(
          "hyscale_job_comm_seconds",
          "Context-parallel communication per training step (rank 0): exposed (waited for) or "
          "overlapped (hidden behind computation).",
          {"job_id", "kind"}, StepBuckets())),
      step_seconds_(registry_.AddHistogram(
          "hyscale_job_step_seconds", "Training step time (rank 0).", {"job_id"}, StepBuckets())),
      tokens_per_second_(registry_.AddGauge("hyscale_job_tokens_per_second",
                                            "Training throughput (rank 0).", {"job_id"})),
      loss_(registry_.AddGauge("hyscale_job_loss", "Training loss (rank 0).", {"job_id"})),
      indexer_recall_(registry_.AddGauge("hyscale_job_indexer_recall",
                                         "Indexer recall at the last evaluation.", {"job_id"})),
      key_sharing_(registry_.AddGauge(
          "hyscale_job_key_sharing",
          "Selected keys over distinct keys of G adjacent queries' selections at the last "
          "evaluation (1: none shared; G: alike).",
          {"job_id", "group"})),
      peak_memory_(registry_.AddGauge("hyscale_job_peak_memory_bytes",
                                      "Peak memory of rank 0's trainer.", {"job_id"})),
      step_(registry_.AddGauge("hyscale_job_step", "Last reported training step.", {"job_id"})),
      running_(registry_.AddGauge("hyscale_job_running", "1 while the job is RUNNING, else 0.",
                                  {"job_id"})),
      restarts_(registry_.AddCounter("hyscale_job_restarts_total",
                                     "Restarts of the job seen by this coordinator process.",
                                     {"job_id"})),
      predicted_memory_(registry_.AddGauge("hyscale_job_predicted_memory_bytes",
                                           "Planner's estimate of one rank's peak memory.",
                                           {"job_id"})),
      predicted_step_(registry_.AddGauge(
          "hyscale_job_predicted_step_seconds",
          "Planner's predicted step time (compare with hyscale_job_step_seconds).", {"job_id"})) {
  submissions_->Inc({}, 0);  // exported as 0 before the first submission
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    jobs_->Set({StateLabel(v1::JobState_Name(s), 10)}, 0);
  }
  for (int s = v1::WorkerState_MIN + 1; s <= v1::WorkerState_MAX; ++s) {
    workers_->Set({StateLabel(v1::WorkerState_Name(s), 13)}, 0);
  }
}

void ServerMetrics::SetJobCounts(const std::map<v1::JobState, int>& counts) {
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    const auto it = counts.find(static_cast<v1::JobState>(s));
    jobs_->Set({StateLabel(v1::JobState_Name(s), 10)}, it == counts.end() ? 0 : it->second);
  }
}

void ServerMetrics::SetWorkerCounts(const std::map<v1::WorkerState, int>& counts) {
  for (int s = v1::WorkerState_MIN + 1; s <= v1::WorkerState_MAX; ++s) {
    const auto it = counts.find(static_cast<v1::WorkerState>(s));
    workers_->Set({StateLabel(v1::WorkerState_Name(s), 13)}, it == counts.end() ? 0 : it->second);
  }
}

void ServerMetrics::JobSubmitted() {
  submissions_->Inc({});
}

void ServerMetrics::JobScheduled(double latency_seconds) {
  scheduling_latency_->Observe({}, latency_seconds);
}

void ServerMetrics::Step(const std::string& job_id, const v1::TrainerEventLine::Step& step) {
  for (const auto& [phase, seconds] : step.phase_seconds()) {
    if (IsPhaseName(phase)) step_phase_->Observe({job_id, phase}, seconds);
  }
  if (step.has_comm()) {
    comm_seconds_->Observe({job_id, "exposed"}, step.comm().exposed());
    comm_seconds_->Observe({job_id, "overlapped"}, step.comm().overlapped());
  }
  step_seconds_->Observe({job_id}, step.step_seconds());
  tokens_per_second_->Set({job_id}, step.tokens_per_second());
  loss_->Set({job_id}, step.loss());
  if (step.has_evaluation()) indexer_recall_->Set({job_id}, step.evaluation().indexer_recall());
  for (const auto& shared : step.evaluation().key_sharing()) {
    // The trainer's G only: a label's values stay few whatever a trainer writes.
    if (!IsKeySharingGroup(shared.group())) continue;
    key_sharing_->Set({job_id, absl::StrCat(shared.group())}, shared.selected_per_distinct());
  }
  peak_memory_->Set({job_id}, static_cast<double>(step.peak_memory_bytes()));
  step_->Set({job_id}, static_cast<double>(step.step()));
}

void ServerMetrics::JobPlanned(const std::string& job_id, int64_t predicted_memory_bytes,
                               double predicted_step_seconds) {
  predicted_memory_->Set({job_id}, static_cast<double>(predicted_memory_bytes));
  predicted_step_->Set({job_id}, predicted_step_seconds);
}

void ServerMetrics::StagePredicted(const std::string& job_id, int64_t predicted_memory_bytes,
                                   double predicted_step_seconds) {
  predicted_memory_->Set({job_id}, static_cast<double>(predicted_memory_bytes));
  if (predicted_step_seconds > 0) predicted_step_->Set({job_id}, predicted_step_seconds);
}

void ServerMetrics::JobState(const std::string& job_id, v1::JobState state) {
  if (state == v1::JOB_STATE_PENDING) return;  // queued jobs get series once placed
  running_->Set({job_id}, state == v1::JOB_STATE_RUNNING ? 1 : 0);
  // Exported as 0 from the start: a counter that first appears at 1 hides that restart from
  // increase(), and the restart-loop alert would see one restart too few.
  restarts_->Inc({job_id}, 0);
}

void ServerMetrics::JobRestarted(const std::string& job_id) {
  restarts_->Inc({job_id});
}

void ServerMetrics::JobEnded(const std::string& job_id, absl::Time when) {
  running_->Set({job_id}, 0);
  std::lock_guard<std::mutex> lock(mu_);
  ended_.emplace(job_id, when);
}

void ServerMetrics::Expire(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ended_.begin(); it != ended_.end();) {
    if (now - it->second < retention_) {
      ++it;
      continue;
    }
    registry_.RemoveWhere("job_id", it->first);
    it = ended_.erase(it);
  }
}

void ServerMetrics::Rpc(const std::string& method, const std::string& code, double seconds) {
  rpc_requests_->Inc({method, code});
  rpc_duration_->Observe({method}, seconds);
}

}  // namespace hyscale::server
