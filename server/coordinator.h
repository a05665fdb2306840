// The coordinator's core: jobs, workers and the job state machine, persisted in the Store.
//
//   PENDING -> SCHEDULED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
//   SCHEDULED | RUNNING -> RESTARTING -> (backoff) -> SCHEDULED ...
//
// A job becomes SCHEDULED when the Scheduler places all its ranks (RunRank goes to each worker),
// RUNNING when every rank reported its trainer started, SUCCEEDED when every rank exited 0.
// A context-parallel job (ranks > 1) starts in two steps: only rank 0 is sent first, with
// rendezvous "<its worker's address>:0"; its trainer serves the group's store on a port the
// kernel picks and publishes "host:port" in a `rendezvous` event, which is stored with the job
// (Job.rendezvous) before ranks 1.. are sent with it. No address within rendezvous_timeout fails
// the attempt like a failed rank.
// A rank exiting 2 (bad input) fails the job; any other failure, or the loss of a worker, stops
// the job's other ranks and restarts it (attempt = restarts, resume from its checkpoints) after
// restart_backoff x 2^(restarts-1), until max_restarts is used up (attempts a worker ended, not
// the job, are not counted: Job.start_timeouts, Job.disruptions). Reports of an older attempt
// are ignored, so no job runs twice. Every transition and event is in the Store before the call
// that caused it returns.
//
// No threads of its own and no gRPC: the services call it, and whoever owns it calls Tick()
// periodically (worker liveness, restart backoff, metric expiry), so tests drive it with a
// FakeClock.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "hyscale/v1/events.pb.h"
#include "hyscale/v1/service.pb.h"
#include "planner/profile.h"
#include "proto/constants.h"
#include "server/assignment_queue.h"
#include "server/clock.h"
#include "server/scheduler.h"
#include "server/server_metrics.h"
#include "server/store.h"
#include "server/stream_source.h"

namespace hyscale::server {

struct CoordinatorOptions {
  std::string data_dir;         // hyscale.db and logs/ live here
  std::string checkpoint_root;  // empty: <data_dir>/checkpoints
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  absl::Duration restart_backoff = absl::Seconds(1);
  // Extra time, on top of the heartbeat timeout, that workers known from the store get to
  // re-register after the coordinator (re)starts: agents back off while it is down (gRPC's
  // reconnect backoff plus their own, up to seconds), and declaring their healthy ranks lost would
  // restart jobs for nothing.
  absl::Duration recovery_grace = absl::Seconds(10);
  // The planner's device profile for GPU jobs (planner/profile.h); CPU jobs and jobs
  // that take any device are planned on "cpu".
  std::string gpu_profile = "h200";
  // A calibration file (hyscale-calibrate; empty: none) whose figures replace those of the
  // profile it was measured on: "cpu" for a CPU run, else the GPU profile above.
  std::string calibration;
  // How long rank 0 of a context-parallel job gets, once placed, to publish its rendezvous
  // address before the attempt fails.
  absl::Duration rendezvous_timeout = absl::Seconds(120);
  // How long a placed rank gets to report that its trainer started. Past it the attempt fails
  // (restart elsewhere, as for a lost worker) and the worker is excluded from placement for
  // `unhealthy_exclusion`: a worker that registers and heartbeats but starts nothing would
  // otherwise hold every job placed on it, and attract more (it looks the most free).
  absl::Duration start_timeout = absl::Seconds(60);
  absl::Duration unhealthy_exclusion = absl::Minutes(10);
};

// Limits of SubmitJob's validation, besides kMaxRanks (proto/constants.h).
inline constexpr int kMinPriority = -1000;
inline constexpr int kMaxPriority = 1000;
inline constexpr int kMaxRestarts = 100;
inline constexpr size_t kMaxRequestBytes = 1 << 20;
inline constexpr size_t kMaxRequestIdBytes = 256;
// Limits of RegisterWorker's validation.
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr int64_t kMaxWorkerSlots = 4096;

bool IsTerminal(v1::JobState state);

class Coordinator {
 public:
  // Opens (or creates) the store under `options.data_dir` and loads every job and worker: jobs
  // that were SCHEDULED or RUNNING stay so and are reconciled as their workers re-register; a
  // worker that does not come back within the heartbeat timeout (plus the recovery grace) is
  // declared lost. `metrics` may
  // be null.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(CoordinatorOptions options, Clock* clock,
                                                           ServerMetrics* metrics);

  // ---- JobService ----
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  absl::StatusOr<v1::Plan> PlanJob(const v1::PlanJobRequest& request);
  // A job's stored events with sequence > `after_sequence`, at most `limit` (the web view's
  // polling); NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<v1::JobEvent>> JobEvents(const std::string& job_id,
                                                      int64_t after_sequence, int limit);

  // Streams, pulled without blocking (stream_source.h) by a reactor or a test.
  // WatchJob: a StateChange with the current state first (sequence 0: a snapshot, not a stored
  // event), then the stored events after `after_sequence`, then new ones; ends after the terminal
  // state's event, or on Shutdown (UNAVAILABLE).
  absl::StatusOr<std::unique_ptr<StreamSource<v1::JobEvent>>> WatchJob(
      const v1::WatchJobRequest& request);
  // A rank's log from `offset`; with `follow`, goes on until the job is terminal.
  absl::StatusOr<std::unique_ptr<StreamSource<v1::LogChunk>>> StreamLogs(
      const v1::StreamLogsRequest& request);

  // ---- WorkerService ----
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // A new assignment queue for the worker (closing its previous one), holding a RunRank for each
  // rank the coordinator wants there that the worker does not report running.
  absl::StatusOr<std::shared_ptr<AssignmentQueue>> OpenAssignments(
      const v1::StreamAssignmentsRequest& request);
  absl::Status ReportStatus(const v1::ReportStatusRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request);

  // Declares silent workers lost, restarts jobs whose backoff ended, expires metrics.
  void Tick();
  // Ends every stream (watch, logs, assignments) now and any opened later.
  void Shutdown();

  std::string LogPath(const std::string& job_id, int rank) const;
  std::string CheckpointDir(const std::string& job_id) const;

 private:
  using RankKey = std::tuple<std::string, int, int>;  // job id, rank, attempt

  struct RankState {
    bool started = false;
    bool exited = false;
    bool succeeded = false;                        // exited 0
    absl::Time start_by = absl::InfiniteFuture();  // sent: must report started by then
  };
  struct JobEntry {
    v1::Job job;
    int64_t order = 0;          // submission order
    int64_t last_sequence = 0;  // of its events, written to the store
    // Of its events known committed, which watches can read: behind last_sequence while a report
    // batch or a submission's group commit is open.
    int64_t stored_sequence = 0;
    std::vector<RankState> ranks;  // of the current attempt
    absl::Time queued_at;          // PENDING since (scheduling latency)
    // Its insert's group-commit ticket; 0 for a job loaded from the store.
    Store::Ticket insert_ticket = 0;
    int64_t log_appends = 0;  // log streams compare it across a read
    absl::Time restart_at;    // RESTARTING: placed again from then on
    // SCHEDULED context-parallel job whose rank 0 has not published: the attempt fails then.
    absl::Time rendezvous_deadline = absl::InfiniteFuture();
    // PENDING: the usable device memory (PlanningProfile's) it was last planned again for, so
    // that a plan no device holds is tried once per change of the devices, not every pass.
    double replanned_for = 0;
  };
  // The planner's device profiles, calibrated when the options name a file.
  struct Profiles {
    planner::DeviceProfile gpu, cpu;
    bool gpu_calibrated = false;  // --calibration measured on the GPU profile's card
  };
  static absl::StatusOr<Profiles> LoadProfiles(const CoordinatorOptions& options);
  const planner::DeviceProfile& ProfileFor(const v1::Resources& resources) const;
  // Under the lock: what AUTO plans and memory estimates use, ProfileFor's, for a GPU job with its
  // usable memory capped by the online workers' devices, and the figures of their card's built-in
  // profile where it names one (unless a calibration stands for the configured one).
  planner::DeviceProfile PlanningProfile(const v1::Resources& resources) const;
  // Under the lock, where the online workers' devices changed (fleet_changed_): plans again, from
  // Job.requested_spec, each PENDING GPU job whose plan those devices cannot hold, where a new
  // one fits them (stored with a JobReplanned event).
  void ReplanWaitingJobs();

  struct WorkerEntry {
    v1::WorkerInfo info;
    // The registered agent's RegisterWorkerRequest.instance, stored with the worker so that the
    // lease survives a coordinator restart (empty only for a record older than that).
    std::string instance;
    absl::Time last_seen;
    // Whether its agent has registered or heartbeated since this coordinator started. A worker
    // restored from the store takes no new ranks before then: its agent may have stopped while we
    // were down, and a rank placed there would wait out the lease and fail with it.
    bool heard = false;
    bool left = false;  // LOST because its agent said it stopped, not for its silence
    std::vector<Slot> slots;
    std::map<RankKey, int> stopping;  // told to stop, slot (flat index) busy until gone
    std::shared_ptr<AssignmentQueue> queue;
  };

  Coordinator(CoordinatorOptions options, Profiles profiles, Clock* clock, ServerMetrics* metrics,
              std::unique_ptr<Store> store);
  absl::Status Load();

  // Persists `updated` (and `events`, stamped with sequence and time) and then adopts it.
  absl::Status Commit(JobEntry& entry, v1::Job updated, std::vector<v1::JobEvent> events);
  // Commit with a StateChange event; terminal states get finished_at and release their ranks.
  absl::Status Transition(JobEntry& entry, v1::JobState to, const std::string& reason);
  absl::Status TransitionWith(JobEntry& entry, v1::Job updated, v1::JobState to,
                              const std::string& reason);

  // A full scheduling pass, but only when capacity may have grown since the last one
  // (pass_needed_): otherwise it could place nobody that waits.
  void Schedule();
  bool PassNeeded() const;  // pass_needed_, or a restart's backoff ended
  void SchedulePass();
  // PENDING jobs and RESTARTING ones whose backoff ended; notes the next backoff end.
  std::vector<JobRequest> WaitingJobs();
  // Stores a pass's decisions: reasons of jobs that wait, placements of jobs that start.
  void Apply(std::vector<Decision> decisions);
  // Makes `entry` SCHEDULED on `placement` and sends its ranks; false if that was not stored.
  bool Start(JobEntry& entry, std::vector<v1::RankPlacement> placement);
  // Sends RunRank to the placed ranks in [first, last).
  void StartRanks(JobEntry& entry, int first, int last);
  // Whether `rank` of the current attempt may be sent now: every rank of a single-rank job;
  // rank 0 of a context-parallel job until it has published its address, the others after.
  static bool Sendable(const v1::Job& job, int rank);
  // Rank 0's `rendezvous` event (a TrainerEvent) for the current attempt: stores the address
  // with `event`; the other ranks are sent by FinishPublished. A second one, or a bad address,
  // only stores `event`.
  absl::Status PublishRendezvous(JobEntry& entry, v1::JobEvent event);
  // After a ReportStatus batch: once it is committed, sends ranks 1.. of the jobs it published
  // (a RunRank never carries an address the store could still lose); if it was not, forgets
  // their addresses, so the reports sent again publish them again.
  void FinishPublished(bool committed);
  // Fails the attempts of context-parallel jobs whose rank 0 did not publish in time.
  void ExpireRendezvous();
  // Fails the attempts of jobs with a rank that was sent but did not start in time, excluding
  // its worker from placement for a while; ends exclusions that are over.
  void ExpireStarts();
  // Sends StopRank to every placed rank of `job` (as it was before a transition) that has not
  // exited; their slots stay busy until their worker stops reporting them.
  void StopRanks(const v1::Job& job, const std::vector<RankState>& ranks,
                 const std::string& reason);
  // Why an attempt ended: the job (a rank failed, or was lost with its worker while running), a
  // worker that did not start it (Job.start_timeouts), or a worker that went away under it
  // (Job.disruptions: its agent stopped the rank on shutdown, or it left or was lost before the
  // rank started). The last two are not counted against max_restarts, up to
  // kMaxUncountedAttempts of them.
  enum class AttemptEnd { kFailed, kNotStarted, kDisrupted };
  // Restarts the job if restarts remain (always for an uncounted end), else fails it.
  absl::Status FailAttempt(JobEntry& entry, std::string why, AttemptEnd end = AttemptEnd::kFailed);
  absl::Status MarkStarted(JobEntry& entry, int rank);
  // Errors are the store's: the report was not applied and should be sent again.
  absl::Status HandleReport(WorkerEntry& worker, const v1::RankReport& report);
  absl::Status HandleExit(JobEntry& entry, int rank, const v1::RankExit& exit);
  // Puts jobs back as they were before a report batch that was not stored.
  void Restore(std::map<std::string, JobEntry> before);
  void AppendLog(const std::string& job_id, int rank, const std::string& data);
  // Marks the worker LOST; RestartJobsOnLostWorkers then restarts its jobs.
  void DeclareLost(WorkerEntry& worker);
  // Restarts (or fails) every SCHEDULED/RUNNING job with a rank on a worker that is not online.
  void RestartJobsOnLostWorkers();
  absl::Status PersistWorker(const WorkerEntry& worker);
  // The ONLINE worker `worker_id` when `instance` holds its name (or its stored record predates
  // stored leases), else null: a caller with the token but not the lease gets nothing of a live
  // worker.
  WorkerEntry* Holder(const std::string& worker_id, const std::string& instance);
  void Send(const std::string& worker_id, v1::Assignment assignment);
  bool Wanted(const v1::RankRef& ref, const std::string& worker_id) const;
  std::vector<WorkerView> WorkerViews() const;
  int FlatSlot(const WorkerEntry& worker, const v1::Job& job,
               const v1::RankPlacement& placement) const;
  v1::RunRank MakeRunRank(const JobEntry& entry, const v1::RankPlacement& placement) const;
  // Keeps job_counts_ and placed_ in step with a job entering (+1) or leaving (-1) `state`.
  void Track(const std::string& job_id, v1::JobState state, int delta);
  void UpdateGauges();
  // Exports the planner's predictions for `job` beside what it measures.
  void ExportPlan(const v1::Job& job);
  // Rank 0 started a stage: the stage's predictions replace the job's (ServerMetrics).
  void ExportStagePlan(const v1::Job& job, const v1::TrainerEventLine::StageStarted& started);
  std::string NewJobId();
  // SubmitJob under the lock: a retry's earlier job, or the new job, adopted, staged in the store
  // and scheduled; with the ticket to sync before answering.
  absl::StatusOr<std::pair<v1::Job, Store::Ticket>> StageSubmission(
      v1::Job job, const v1::SubmitJobRequest& request);
  // Drops a submission whose group commit failed (nothing of it is stored).
  void ForgetUnstored(const std::string& job_id);
  absl::Status ValidateSubmit(const v1::SubmitJobRequest& request) const;

  class EventStream;
  class LogStream;
  // A waiting stream's wake-up: once an event after `after_sequence` is stored (a log stream,
  // kLogsOnly: once its job's log grows or an event is stored), or on Shutdown. One-shot.
  struct Subscription {
    int64_t after_sequence;
    std::function<void()> wake;
  };
  // Under the lock: the stream pulls again when woken. 0 is never an id.
  uint64_t Subscribe(const std::string& job_id, int64_t after_sequence, std::function<void()> wake);
  // Takes the lock; no wake of `id` runs after it returns. 0: nothing.
  void Unsubscribe(const std::string& job_id, uint64_t id);
  // Wakes the streams of `job_id` that are due.
  void WakeStreams(const std::string& job_id, bool log_grew);
  // The job's events up to `sequence` are committed: watches may read them.
  void EventsStored(JobEntry& entry, int64_t sequence);

  const CoordinatorOptions options_;
  const Profiles profiles_;
  Clock* const clock_;
  ServerMetrics* const metrics_;
  const std::unique_ptr<Store> store_;

  std::mutex mu_;
  bool shutdown_ = false;
  // Waiting streams by job id, then subscription id.
  std::map<std::string, std::map<uint64_t, Subscription>> subscriptions_;
  uint64_t next_subscription_ = 1;
  std::map<std::string, JobEntry> jobs_;
  std::map<int64_t, std::string> by_order_;        // submission order -> job id
  std::map<std::string, std::string> by_request_;  // request_id -> job id
  std::map<std::string, WorkerEntry> workers_;
  // Jobs with events written in the report batch being applied: they are stored, and their
  // watches woken, once the batch commits.
  std::set<std::string> batch_jobs_;
  bool in_batch_ = false;
  // (job id, attempt) of the rendezvous addresses published in the batch being applied.
  std::vector<std::pair<std::string, int>> published_;
  // Maintained on every state change, so gauges and slot views need not walk every job.
  std::map<v1::JobState, int> job_counts_;
  std::set<std::string> placed_;  // SCHEDULED and RUNNING jobs
  int64_t next_order_ = 1;
  std::mt19937_64 random_;

  // Scheduling state between passes, so a submission costs O(workers), not O(waiting jobs).
  // pass_needed_: capacity may have grown since the last pass (a worker joined or was lost, a
  // slot or a job ended, a waiting job left): a waiting job might fit now, so new jobs cannot be
  // decided alone (see ScheduleNew). reasons_stale_: a job placed or held back on submit changed
  // what the waiting jobs' reasons would say; the next Tick refreshes them.
  bool pass_needed_ = true;
  bool reasons_stale_ = false;
  // A worker registered, came back or was lost since the last ReplanWaitingJobs.
  bool fleet_changed_ = true;
  std::optional<int> blocked_below_;                  // the last pass's: see scheduler.h
  absl::Time next_restart_ = absl::InfiniteFuture();  // earliest backoff end not yet passed
};

}  // namespace hyscale::server
