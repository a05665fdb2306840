#include "server/coordinator.h"

#include <absl/strings/escaping.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>
#include <vector>

#include "planner/planner.h"
#include "proto/cp_layout.h"
#include "proto/job_spec.h"
#include "server/trainer_events.h"
#include "util/log.h"

namespace hyscale::server {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
// A list RPC's page size: 0 means the default, more than the maximum means the maximum.
absl::StatusOr<int> PageSize(int requested) {
  if (requested < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be >= 0 (got ", requested, ")"));
  }
  return requested == 0 ? kDefaultPageSize : std::min(requested, kMaxPageSize);
}
// A page also ends before it passes this many bytes (a job is at most ~1 MiB: SubmitJob's cap), so
// it stays well inside a client's default 4 MiB message limit.
constexpr size_t kMaxPageBytes = 2 << 20;
constexpr int kEventBatch = 256;
constexpr size_t kLogChunkBytes = 64 * 1024;
constexpr int kLogChunksPerPull = 4;
// A subscription's after_sequence for a log stream: woken by log appends and by events.
constexpr int64_t kLogsOnly = -1;
// Backoff doubles per restart up to 2^kMaxBackoffDoublings times the base.
constexpr int kMaxBackoffDoublings = 10;
// Attempts of a job that may end without counting against max_restarts (start timeouts and
// disruptions, Job.disruptions): later ones count, so workers that keep failing to start ranks or
// keep leaving cannot restart a job forever.
constexpr int kMaxUncountedAttempts = 10;

void SetTime(google::protobuf::Timestamp* stamp, absl::Time time) {
  const int64_t nanos = absl::ToUnixNanos(time);
  stamp->set_seconds(nanos / 1'000'000'000);
  stamp->set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& stamp) {
  return absl::FromUnixSeconds(stamp.seconds()) + absl::Nanoseconds(stamp.nanos());
}

std::string StateName(v1::JobState state) {
  return v1::JobState_Name(state).substr(10);
}

std::string DescribeExit(int rank, const v1::RankExit& exit) {
  std::string text = exit.exit_code() == -1
                         ? absl::StrCat("rank ", rank, " was killed by signal ", exit.signal())
                         : absl::StrCat("rank ", rank, " exited with code ", exit.exit_code());
  // Agents often describe the exit themselves ("killed by signal 9 (Killed)"): keep their words,
  // without repeating ours.
  const std::string& reason = exit.reason();
  if (reason.empty()) return text;
  if (absl::StartsWith(reason, "killed by signal") ||
      absl::StartsWith(reason, "exited with code")) {
    return absl::StrCat("rank ", rank, ": ", reason);
  }
  return absl::StrCat(text, ": ", reason);
}

bool SameRef(const v1::RankRef& a, const v1::RankRef& b) {
  return a.job_id() == b.job_id() && a.rank() == b.rank() && a.attempt() == b.attempt();
}

// The planner's view of a job's resources: its ranks, on `profile` (Coordinator::ProfileFor).
planner::PlanOptions PlannerOptions(const v1::Resources& resources,
                                    const planner::DeviceProfile& profile) {
  planner::PlanOptions options;
  options.gpus = RanksOf(resources);
  options.profile = profile;  // every indexer group: hyscale-train runs both
  return options;
}

// The planner's peak memory of one rank for the job's own settings. INVALID_ARGUMENT, with the
// planner's reason, when they cannot run on the profile's devices at all: such a job would only
// crash-loop through its restarts.
absl::StatusOr<int64_t> MemoryPerRank(const v1::JobSpec& spec, const v1::Resources& resources,
                                      const planner::DeviceProfile& profile) {
  const planner::PlanOptions options = PlannerOptions(resources, profile);
  // A query_chunk of 0 lets the trainer choose one that fits (recomputed layers); every stage
  // must fit.
  const planner::Prediction own =
      planner::PredictJob(spec, planner::CandidateOf(spec), options.profile, options.gpus);
  if (!own.rejected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: does not fit ", options.gpus, " ",
                                                   options.profile.name,
                                                   " device(s): ", own.rejected));
  }
  return static_cast<int64_t>(own.memory.total);
}

// `parallelism: {mode: AUTO}`: the plan that fits with the least job time, written into the spec
// the trainer gets (CP degree, layout, G, recomputation policy).
absl::Status ApplyPlan(const v1::Resources& resources, const planner::DeviceProfile& profile,
                       v1::JobSpec* spec) {
  const planner::PlanOptions options = PlannerOptions(resources, profile);
  const planner::PlanResult plan = planner::PlanJob(*spec, options);
  if (plan.winner < 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.parallelism.mode: AUTO found no plan for ",
                                                   options.gpus, " ", options.profile.name,
                                                   " devices: ", plan.why.front()));
  }
  const planner::Candidate& best = plan.candidates[plan.winner].candidate;
  v1::ParallelismSpec* par = spec->mutable_parallelism();
  par->set_context_parallel(best.cp);
  par->set_cp_layout(CpLayoutName(best.layout));
  par->set_query_group(best.group);
  par->set_separate_indexer_group(best.indexer == planner::IndexerGroup::kSeparate);
  spec->mutable_recompute()->set_enabled(best.recompute != planner::Recompute::kNone);
  spec->mutable_recompute()->set_selection_replay(best.recompute == planner::Recompute::kReplay);
  return absl::OkStatus();
}

// A submission's spec and resources as a job runs them.
struct PlannedJob {
  v1::JobSpec spec;
  v1::Resources resources;
};

// What a submission is planned from: defaults applied, at least the spec's CP degree of ranks.
PlannedJob Requested(const v1::JobSpec& spec, const v1::Resources& resources) {
  PlannedJob job{spec, resources};
  ApplyDefaults(&job.spec);
  job.resources.set_ranks(std::max(RanksOf(resources), job.spec.parallelism().context_parallel()));
  return job;
}

// AUTO's plan and, unless the request set one, the memory estimate placement requires: on
// `fleet` (Coordinator::PlanningProfile, the online workers' devices) where they fit, else on
// `configured` (the job then waits for larger devices, and its reason says so).
absl::Status PlanWithin(const planner::DeviceProfile& fleet,
                        const planner::DeviceProfile& configured, PlannedJob* job) {
  const bool capped = fleet.memory_bytes < configured.memory_bytes;
  if (job->spec.parallelism().mode() == v1::AUTO) {
    const v1::JobSpec requested = job->spec;
    absl::Status status = ApplyPlan(job->resources, fleet, &job->spec);
    if (!status.ok() && capped) {
      job->spec = requested;
      status = ApplyPlan(job->resources, configured, &job->spec);
    }
    if (!status.ok()) return status;
    // The plan may use fewer of the offered devices than asked for; the job holds what it uses.
    job->resources.set_ranks(job->spec.parallelism().context_parallel());
  }
  auto memory = MemoryPerRank(job->spec, job->resources, fleet);
  if (!memory.ok() && capped) memory = MemoryPerRank(job->spec, job->resources, configured);
  if (!memory.ok()) return memory.status();
  // Placed only on devices the estimate fits, as PlanJob places it; where none does, the job
  // waits and its reason says so.
  if (job->resources.memory_bytes_per_rank() == 0) {
    job->resources.set_memory_bytes_per_rank(*memory);
  }
  return absl::OkStatus();
}

// "CP 2 (zigzag), G 4, recomputation with replay, 30.1 GiB a rank".
std::string DescribePlan(const v1::JobSpec& spec, const v1::Resources& resources) {
  const v1::ParallelismSpec& par = spec.parallelism();
  std::string line = absl::StrCat("CP ", std::max(1, par.context_parallel()));
  if (par.context_parallel() > 1) absl::StrAppend(&line, " (", par.cp_layout(), ")");
  if (par.query_group() > 0) absl::StrAppend(&line, ", G ", par.query_group());
  absl::StrAppend(
      &line, ", ", RecomputeName(spec.recompute()),
      absl::StrFormat(", %.1f GiB a rank", resources.memory_bytes_per_rank() / double(1 << 30)));
  return line;
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// ---------------------------------------------------------------------------------------------
// Opening and recovery

Coordinator::Coordinator(CoordinatorOptions options, Profiles profiles, Clock* clock,
                         ServerMetrics* metrics, std::unique_ptr<Store> store)
    : options_(std::move(options)),
      profiles_(std::move(profiles)),
      clock_(clock),
      metrics_(metrics),
      store_(std::move(store)),
      random_(std::random_device{}()) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(CoordinatorOptions options,
                                                               Clock* clock,
                                                               ServerMetrics* metrics) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir: required");
  auto profiles = LoadProfiles(options);
  if (!profiles.ok()) return profiles.status();
  std::error_code error;
  std::filesystem::create_directories(options.data_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat(options.data_dir, ": cannot create directory: ", error.message()));
  }
  auto store = Store::Open((std::filesystem::path(options.data_dir) / "hyscale.db").string());
  if (!store.ok()) return store.status();
  std::unique_ptr<Coordinator> coordinator(
      new Coordinator(std::move(options), *std::move(profiles), clock, metrics, std::move(*store)));
  if (auto status = coordinator->Load(); !status.ok()) return status;
  return coordinator;
}

absl::StatusOr<Coordinator::Profiles> Coordinator::LoadProfiles(const CoordinatorOptions& options) {
  auto gpu = planner::BuiltinProfile(options.gpu_profile);
  if (!gpu.ok()) return gpu.status();
  auto cpu = planner::BuiltinProfile("cpu");
  if (!cpu.ok()) return cpu.status();
  Profiles profiles{*std::move(gpu), *std::move(cpu)};
  if (options.calibration.empty()) return profiles;
  auto device = planner::CalibrationDevice(options.calibration);
  if (!device.ok()) return device.status();
  // A file from another built-in GPU would silently misplan every job: refuse it.
  const auto builtin = planner::BuiltinProfileNames();
  const bool other_gpu = *device != "cpu" && *device != options.gpu_profile &&
                         std::count(builtin.begin(), builtin.end(), *device) > 0;
  if (other_gpu) {
    return absl::InvalidArgumentError(absl::StrCat(options.calibration, ": measured on ", *device,
                                                   ", but the GPU profile is ",
                                                   options.gpu_profile));
  }
  planner::DeviceProfile* target = *device == "cpu" ? &profiles.cpu : &profiles.gpu;
  profiles.gpu_calibrated = target == &profiles.gpu;
  if (auto status = planner::LoadCalibration(options.calibration, target); !status.ok()) {
    return status;
  }
  return profiles;
}

const planner::DeviceProfile& Coordinator::ProfileFor(const v1::Resources& resources) const {
  // A job that takes any device may land on a CPU worker: planned on the CPU profile.
  return resources.device_kind() == v1::DEVICE_KIND_GPU ? profiles_.gpu : profiles_.cpu;
}

// The GPU profile speaks for one kind of card (--gpu-profile); the fleet may hold others. A GPU job
// is planned for the job's ranks-th largest GPU among the online workers: within its usable memory
// where that is less than the profile's, so that its plan (an AUTO job's recomputation and chunks)
// and its memory estimate fit devices it can be placed on, instead of a larger card's plan waiting
// for a card the fleet lacks; and with the figures of the built-in profile its name gives (an H100
// is planned as an h800, not as the configured h200), unless --calibration measured the configured
// card. Devices that report no memory do not count; with fewer GPUs than ranks the profile stands
// (the job waits for devices, and says so).
planner::DeviceProfile Coordinator::PlanningProfile(const v1::Resources& resources) const {
  planner::DeviceProfile profile = ProfileFor(resources);
  if (resources.device_kind() != v1::DEVICE_KIND_GPU) return profile;
  std::vector<const Slot*> gpus;
  for (const auto& [id, worker] : workers_) {
    if (worker.info.state() != v1::WORKER_STATE_ONLINE) continue;
    for (const Slot& slot : worker.slots) {
      if (slot.kind == v1::DEVICE_KIND_GPU && slot.memory_bytes > 0) gpus.push_back(&slot);
    }
  }
  const size_t ranks = static_cast<size_t>(RanksOf(resources));
  if (ranks == 0 || gpus.size() < ranks) return profile;
  std::nth_element(gpus.begin(), gpus.begin() + (ranks - 1), gpus.end(),
                   [](const Slot* a, const Slot* b) { return a->memory_bytes > b->memory_bytes; });
  const Slot& card = *gpus[ranks - 1];
  if (const std::string named = planner::BuiltinProfileOfDevice(card.name);
      !profiles_.gpu_calibrated && !named.empty() && named != profile.name) {
    auto builtin = planner::BuiltinProfile(named);
    if (builtin.ok()) {
      profile = *std::move(builtin);
      profile.name = absl::StrCat(named, " (the workers' ", card.name, ")");
    }
  }
  const double usable = planner::UsableMemoryBytes(static_cast<double>(card.memory_bytes));
  if (usable < profile.memory_bytes) {
    profile.memory_bytes = usable;
    profile.name = absl::StrFormat("%s (%.1f GiB usable, the workers' devices)", profile.name,
                                   usable / (1 << 30));
  }
  return profile;
}

// A job planned while no worker's devices were known (or for devices since lost) would wait
// forever for a card the fleet lacks; planned again from its request, it runs on what is there.
// Jobs whose plan the devices hold keep it (a larger card joining does not move them), as do
// those whose request set their memory or cannot be planned smaller. Each waiting job is tried
// once per change of the memory it is planned within; a pass plans at most kReplansPerPass of
// them (each is a planner search, under the lock), leaving the rest to the passes after it.
void Coordinator::ReplanWaitingJobs() {
  constexpr int kReplansPerPass = 64;
  fleet_changed_ = false;
  int replans = 0;
  std::map<int32_t, planner::DeviceProfile> fleets;  // by ranks (GPU jobs only)
  for (auto& [id, entry] : jobs_) {
    const v1::Job& job = entry.job;
    if (job.state() != v1::JOB_STATE_PENDING || !job.has_requested_resources() ||
        job.resources().device_kind() != v1::DEVICE_KIND_GPU) {
      continue;
    }
    PlannedJob planned = Requested(job.requested_spec(), job.requested_resources());
    auto fleet = fleets.find(planned.resources.ranks());
    if (fleet == fleets.end()) {
      fleet = fleets.emplace(planned.resources.ranks(), PlanningProfile(planned.resources)).first;
    }
    const planner::DeviceProfile& configured = ProfileFor(planned.resources);
    const double usable = fleet->second.memory_bytes;
    if (usable >= configured.memory_bytes ||
        static_cast<double>(job.resources().memory_bytes_per_rank()) <= usable ||
        entry.replanned_for == usable) {
      continue;
    }
    if (replans++ == kReplansPerPass) {
      fleet_changed_ = true;  // the next pass goes on
      pass_needed_ = true;
      return;
    }
    entry.replanned_for = usable;
    if (!PlanWithin(fleet->second, configured, &planned).ok() ||
        static_cast<double>(planned.resources.memory_bytes_per_rank()) > usable) {
      continue;  // nothing it could run fits these devices either
    }
    v1::Job updated = job;
    *updated.mutable_spec() = planned.spec;
    *updated.mutable_resources() = planned.resources;
    v1::JobEvent event;
    v1::JobReplanned* replanned = event.mutable_replanned();
    replanned->set_reason(absl::StrCat(
        "planned again for the online workers' devices (",
        absl::StrFormat("%.1f GiB usable", usable / double(1 << 30)),
        "), which could not hold its plan: ", DescribePlan(job.spec(), job.resources())));
    *replanned->mutable_parallelism() = planned.spec.parallelism();
    *replanned->mutable_recompute() = planned.spec.recompute();
    replanned->set_ranks(planned.resources.ranks());
    replanned->set_memory_bytes_per_rank(planned.resources.memory_bytes_per_rank());
    util::LogInfo("job ", id, ": ", replanned->reason(), "; now ",
                  DescribePlan(planned.spec, planned.resources));
    // A failed write leaves the job as it was, to be tried at the next change.
    (void)Commit(entry, std::move(updated), {std::move(event)});
  }
}

absl::Status Coordinator::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  auto workers = store_->LoadWorkers();
  if (!workers.ok()) return workers.status();
  for (auto& stored : *workers) {
    WorkerEntry& worker = workers_[stored.info.id()];
    worker.slots = SlotsOf(stored.info.devices());
    worker.info = std::move(stored.info);
    // The lease holds across our restart: only the same agent instance takes the name back
    // before the worker is declared lost.
    worker.instance = std::move(stored.instance);
    worker.last_seen = now + options_.recovery_grace;  // time to come back after our restart
  }
  std::vector<std::string> set_aside;
  auto jobs = store_->LoadJobs(&set_aside);
  if (!jobs.ok()) return jobs.status();
  for (const std::string& id : set_aside) {
    util::LogWarning("job ", absl::CHexEscape(id),
                     ": its stored record cannot be read; set aside in table jobs_set_aside of "
                     "hyscale.db (every other job is served)");
  }
  for (auto& job : *jobs) {
    auto last = store_->LastSequence(job.id());
    if (!last.ok()) return last.status();
    JobEntry& entry = jobs_[job.id()];
    entry.order = next_order_++;
    entry.last_sequence = *last;
    entry.stored_sequence = *last;
    entry.queued_at = now;
    entry.restart_at = now + options_.restart_backoff;
    // A RUNNING job's ranks had all started; a SCHEDULED job's ranks are re-sent to workers that
    // do not report them. A rank 0 that published its rendezvous address had started too (so a
    // worker coming back without it fails the attempt); until it has, the timeout runs again,
    // with the grace workers get to come back and deliver what they hold.
    entry.ranks.assign(job.placement_size(),
                       RankState{job.state() == v1::JOB_STATE_RUNNING, false, false});
    if (job.state() == v1::JOB_STATE_SCHEDULED && job.placement_size() > 1) {
      if (!job.rendezvous().empty()) {
        entry.ranks[0].started = true;
      } else {
        entry.rendezvous_deadline = now + options_.recovery_grace + options_.rendezvous_timeout;
      }
    }
    // Ranks sent but not started get their start timeout afresh, plus the recovery grace.
    for (int rank = 0; rank < job.placement_size(); ++rank) {
      if (job.state() == v1::JOB_STATE_SCHEDULED && !entry.ranks[rank].started &&
          Sendable(job, rank)) {
        entry.ranks[rank].start_by = now + options_.recovery_grace + options_.start_timeout;
      }
    }
    by_order_[entry.order] = job.id();
    if (!job.request_id().empty()) by_request_[job.request_id()] = job.id();
    Track(job.id(), job.state(), +1);
    if (!IsTerminal(job.state()) && job.state() != v1::JOB_STATE_PENDING) ExportPlan(job);
    entry.job = std::move(job);
  }
  RestartJobsOnLostWorkers();
  UpdateGauges();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Persistence and transitions

absl::Status Coordinator::Commit(JobEntry& entry, v1::Job updated,
                                 std::vector<v1::JobEvent> events) {
  const absl::Time now = clock_->Now();
  SetTime(updated.mutable_updated_at(), now);
  int64_t sequence = entry.last_sequence;
  for (auto& event : events) {
    event.set_job_id(updated.id());
    event.set_sequence(++sequence);
    SetTime(event.mutable_time(), now);
  }
  if (auto status = store_->UpdateJob(updated, events); !status.ok()) {
    util::LogError("storing job ", updated.id(), " failed: ", status.message());
    return status;
  }
  entry.job = std::move(updated);
  entry.last_sequence = sequence;
  if (events.empty()) return absl::OkStatus();
  if (in_batch_) {
    batch_jobs_.insert(entry.job.id());
  } else {
    EventsStored(entry, sequence);
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Transition(JobEntry& entry, v1::JobState to, const std::string& reason) {
  return TransitionWith(entry, entry.job, to, reason);
}

absl::Status Coordinator::TransitionWith(JobEntry& entry, v1::Job updated, v1::JobState to,
                                         const std::string& reason) {
  const v1::JobState from = entry.job.state();
  const absl::Time now = clock_->Now();
  updated.set_state(to);
  updated.set_reason(reason);
  if (to == v1::JOB_STATE_RUNNING && !updated.has_started_at()) {
    SetTime(updated.mutable_started_at(), now);
  }
  if (IsTerminal(to)) SetTime(updated.mutable_finished_at(), now);
  v1::JobEvent event;
  auto* change = event.mutable_state_change();
  change->set_from(from);
  change->set_to(to);
  change->set_reason(reason);
  change->set_restarts(updated.restarts());
  if (auto status = Commit(entry, std::move(updated), {std::move(event)}); !status.ok()) {
    return status;
  }
  Track(entry.job.id(), from, -1);
  Track(entry.job.id(), to, +1);
  if (metrics_ != nullptr && IsTerminal(to)) metrics_->JobEnded(entry.job.id(), now);
  if (metrics_ != nullptr && to == v1::JOB_STATE_RESTARTING) metrics_->JobRestarted(entry.job.id());
  // Leaving a placement frees slots (or starts a backoff); a waiting job that leaves may have been
  // holding others back. Only becoming SCHEDULED or RUNNING frees nothing.
  if (to != v1::JOB_STATE_SCHEDULED && to != v1::JOB_STATE_RUNNING) pass_needed_ = true;
  UpdateGauges();
  return absl::OkStatus();
}

void Coordinator::Track(const std::string& job_id, v1::JobState state, int delta) {
  job_counts_[state] += delta;
  if (metrics_ != nullptr && delta > 0 && !IsTerminal(state)) metrics_->JobState(job_id, state);
  if (state != v1::JOB_STATE_SCHEDULED && state != v1::JOB_STATE_RUNNING) return;
  if (delta > 0) {
    placed_.insert(job_id);
  } else {
    placed_.erase(job_id);
  }
}

void Coordinator::ExportPlan(const v1::Job& job) {
  if (metrics_ == nullptr) return;
  const planner::PlanOptions options =
      PlannerOptions(job.resources(), PlanningProfile(job.resources()));
  // The prediction placement used (MemoryPerRank), query chunks included.
  const planner::Prediction predicted = planner::PredictJob(
      job.spec(), planner::CandidateOf(job.spec()), options.profile, options.gpus);
  metrics_->JobPlanned(job.id(), static_cast<int64_t>(predicted.memory.total), predicted.step_s);
}

void Coordinator::ExportStagePlan(const v1::Job& job,
                                  const v1::TrainerEventLine::StageStarted& started) {
  if (metrics_ == nullptr || started.predicted_memory().total_bytes() <= 0) return;
  const planner::PlanOptions options =
      PlannerOptions(job.resources(), PlanningProfile(job.resources()));
  std::vector<planner::Prediction> stages;
  planner::PredictJob(job.spec(), planner::CandidateOf(job.spec()), options.profile, options.gpus,
                      &stages);
  const bool known = started.stage() >= 0 && started.stage() < static_cast<int>(stages.size());
  metrics_->StagePredicted(job.id(), started.predicted_memory().total_bytes(),
                           known ? stages[started.stage()].step_s : 0);
}

void Coordinator::UpdateGauges() {
  if (metrics_ == nullptr) return;
  metrics_->SetJobCounts(job_counts_);
  std::map<v1::WorkerState, int> workers;
  for (const auto& [id, worker] : workers_) ++workers[worker.info.state()];
  metrics_->SetWorkerCounts(workers);
}

Coordinator::WorkerEntry* Coordinator::Holder(const std::string& worker_id,
                                              const std::string& instance) {
  const auto found = workers_.find(worker_id);
  if (found == workers_.end() || found->second.info.state() != v1::WORKER_STATE_ONLINE) {
    return nullptr;
  }
  WorkerEntry& worker = found->second;
  return worker.instance.empty() || worker.instance == instance ? &worker : nullptr;
}

absl::Status Coordinator::PersistWorker(const WorkerEntry& worker) {
  auto status = store_->PutWorker(worker.info, worker.instance);
  if (!status.ok()) {
    util::LogError("storing worker ", worker.info.id(), " failed: ", status.message());
  }
  UpdateGauges();
  return status;
}

// ---------------------------------------------------------------------------------------------
// Placement and rank control

int Coordinator::FlatSlot(const WorkerEntry& worker, const v1::Job& job,
                          const v1::RankPlacement& placement) const {
  const v1::DeviceKind kind = job.resources().device_kind();
  for (const Slot& slot : worker.slots) {
    if (kind != v1::DEVICE_KIND_UNSPECIFIED && slot.kind != kind) continue;
    if (slot.kind_index == placement.device_index() && slot.name == placement.device_name()) {
      return slot.flat_index;
    }
  }
  return -1;
}

std::vector<WorkerView> Coordinator::WorkerViews() const {
  std::vector<WorkerView> views;
  std::map<std::string, size_t> index;
  for (const auto& [id, worker] : workers_) {
    // Excluded workers, and restored ones not yet heard from, are left out as if offline.
    if (worker.info.state() != v1::WORKER_STATE_ONLINE || worker.info.has_unhealthy_until() ||
        !worker.heard) {
      continue;
    }
    WorkerView view;
    view.id = id;
    view.slots = worker.slots;
    for (const auto& [key, flat] : worker.stopping) view.busy.insert(flat);
    index[id] = views.size();
    views.push_back(std::move(view));
  }
  for (const std::string& id : placed_) {
    const JobEntry& entry = jobs_.at(id);
    for (const auto& placement : entry.job.placement()) {
      const auto found = index.find(placement.worker_id());
      if (found == index.end()) continue;
      const int flat = FlatSlot(workers_.at(placement.worker_id()), entry.job, placement);
      if (flat >= 0) views[found->second].busy.insert(flat);
    }
  }
  return views;
}

bool Coordinator::PassNeeded() const {
  return pass_needed_ || clock_->Now() >= next_restart_;
}

void Coordinator::Schedule() {
  if (PassNeeded()) SchedulePass();
}

std::vector<JobRequest> Coordinator::WaitingJobs() {
  // Every pass (and a submission's) reads the waiting jobs here, so plans follow the devices first.
  if (fleet_changed_) ReplanWaitingJobs();
  const absl::Time now = clock_->Now();
  next_restart_ = absl::InfiniteFuture();
  std::vector<JobRequest> queue;
  for (const auto& [id, entry] : jobs_) {
    const v1::JobState state = entry.job.state();
    if (state == v1::JOB_STATE_PENDING ||
        (state == v1::JOB_STATE_RESTARTING && now >= entry.restart_at)) {
      queue.push_back({id, entry.job.priority(), entry.order, entry.job.resources()});
    } else if (state == v1::JOB_STATE_RESTARTING) {
      next_restart_ = std::min(next_restart_, entry.restart_at);
    }
  }
  return queue;
}

void Coordinator::SchedulePass() {
  pass_needed_ = false;
  reasons_stale_ = false;
  std::vector<JobRequest> queue = WaitingJobs();
  blocked_below_.reset();
  if (queue.empty()) return;
  Apply(server::Schedule(std::move(queue), WorkerViews(), &blocked_below_));
}

void Coordinator::Apply(std::vector<Decision> decisions) {
  for (auto& decision : decisions) {
    JobEntry& entry = jobs_.at(decision.job_id);
    if (decision.placement.empty()) {
      // A PENDING job's reason says why it waits; a RESTARTING one keeps why it restarted.
      if (entry.job.state() == v1::JOB_STATE_PENDING && entry.job.reason() != decision.reason) {
        v1::Job updated = entry.job;
        updated.set_reason(decision.reason);
        if (!Commit(entry, std::move(updated), {}).ok()) reasons_stale_ = true;
      }
      continue;
    }
    // Not stored: its slots stay free and the job waits, so the next pass tries again.
    if (!Start(entry, std::move(decision.placement))) pass_needed_ = true;
  }
}

bool Coordinator::Start(JobEntry& entry, std::vector<v1::RankPlacement> placement) {
  const bool first_placement = entry.job.state() == v1::JOB_STATE_PENDING;
  v1::Job updated = entry.job;
  updated.clear_placement();
  updated.clear_rendezvous();
  std::set<std::string> hosts;
  for (auto& rank : placement) {
    hosts.insert(rank.worker_id());
    *updated.add_placement() = std::move(rank);
  }
  const std::string reason =
      absl::StrCat("placed ", updated.placement_size(), " rank(s) on ", absl::StrJoin(hosts, ", "));
  if (!TransitionWith(entry, std::move(updated), v1::JOB_STATE_SCHEDULED, reason).ok()) {
    return false;
  }
  entry.ranks.assign(entry.job.placement_size(), RankState{});
  if (first_placement) ExportPlan(entry.job);  // per-job series start once a job is placed
  if (metrics_ != nullptr && first_placement) {
    metrics_->JobScheduled(absl::ToDoubleSeconds(clock_->Now() - entry.queued_at));
  }
  const int world = entry.job.placement_size();
  if (world > 1) entry.rendezvous_deadline = clock_->Now() + options_.rendezvous_timeout;
  StartRanks(entry, 0, world > 1 ? 1 : world);
  return true;
}

v1::RunRank Coordinator::MakeRunRank(const JobEntry& entry,
                                     const v1::RankPlacement& placement) const {
  const v1::Job& job = entry.job;
  v1::RunRank run;
  run.mutable_ref()->set_job_id(job.id());
  run.mutable_ref()->set_rank(placement.rank());
  run.mutable_ref()->set_attempt(job.restarts());
  run.set_world_size(job.placement_size());
  *run.mutable_spec() = job.spec();
  run.set_device_index(placement.device_index());
  if (job.placement_size() > 1 && placement.rank() == 0) {
    // Port 0: the trainer serves its store on a free port and publishes it.
    const auto worker = workers_.find(placement.worker_id());
    const std::string host = worker == workers_.end() ? "" : worker->second.info.address();
    run.set_rendezvous(absl::StrCat(host, ":0"));
  } else {
    run.set_rendezvous(job.rendezvous());
  }
  run.set_checkpoint_dir(CheckpointDir(job.id()));
  run.set_resume(job.restarts() > 0);
  return run;
}

void Coordinator::StartRanks(JobEntry& entry, int first, int last) {
  const absl::Time start_by = clock_->Now() + options_.start_timeout;
  for (int rank = first; rank < last; ++rank) {
    const v1::RankPlacement& placement = entry.job.placement(rank);
    entry.ranks[rank].start_by = start_by;
    v1::Assignment assignment;
    *assignment.mutable_run() = MakeRunRank(entry, placement);
    Send(placement.worker_id(), std::move(assignment));
  }
}

bool Coordinator::Sendable(const v1::Job& job, int rank) {
  if (job.placement_size() <= 1) return true;
  // Rank 0 runs once per attempt: a second one would serve a store the others never hear of.
  return rank == 0 ? job.rendezvous().empty() : !job.rendezvous().empty();
}

absl::Status Coordinator::PublishRendezvous(JobEntry& entry, v1::JobEvent event) {
  v1::Job updated = entry.job;
  const bool first = updated.placement_size() > 1 && updated.rendezvous().empty();
  if (first) {
    auto address = RendezvousAddress(event.trainer().event().rendezvous());
    if (address.ok()) {
      updated.set_rendezvous(*address);
    } else {
      util::LogWarning("job ", updated.id(), " rank 0: ", address.status().message());
    }
  }
  const bool published = !updated.rendezvous().empty() && first;
  if (auto status = Commit(entry, std::move(updated), {std::move(event)}); !status.ok()) {
    return status;
  }
  if (published) published_.emplace_back(entry.job.id(), entry.job.restarts());
  return absl::OkStatus();
}

void Coordinator::FinishPublished(bool committed) {
  for (const auto& [id, attempt] : published_) {
    JobEntry& entry = jobs_.at(id);
    // A later report of the same batch may have ended or restarted the attempt.
    const v1::JobState state = entry.job.state();
    if (entry.job.restarts() != attempt ||
        (state != v1::JOB_STATE_SCHEDULED && state != v1::JOB_STATE_RUNNING)) {
      continue;
    }
    if (committed) {
      StartRanks(entry, 1, entry.job.placement_size());
    } else {
      entry.job.clear_rendezvous();
    }
  }
  published_.clear();
}

void Coordinator::ExpireRendezvous() {
  const absl::Time now = clock_->Now();
  // A copy: FailAttempt takes jobs out of placed_.
  for (const std::string& id : std::vector<std::string>(placed_.begin(), placed_.end())) {
    JobEntry& entry = jobs_.at(id);
    if (entry.job.state() != v1::JOB_STATE_SCHEDULED || entry.job.placement_size() <= 1 ||
        !entry.job.rendezvous().empty() || now < entry.rendezvous_deadline) {
      continue;
    }
    // A failed write leaves the job as it was; the next Tick tries again.
    (void)FailAttempt(entry,
                      absl::StrCat("rank 0 did not publish its rendezvous address within ",
                                   absl::ToDoubleSeconds(options_.rendezvous_timeout), " s"));
  }
}

void Coordinator::ExpireStarts() {
  const absl::Time now = clock_->Now();
  for (auto& [id, worker] : workers_) {
    if (worker.info.has_unhealthy_until() && FromTimestamp(worker.info.unhealthy_until()) <= now) {
      worker.info.clear_unhealthy_until();
      worker.info.clear_unhealthy_reason();
      pass_needed_ = true;  // its devices are capacity again
      (void)PersistWorker(worker);
    }
  }
  // A copy: FailAttempt takes jobs out of placed_.
  for (const std::string& id : std::vector<std::string>(placed_.begin(), placed_.end())) {
    JobEntry& entry = jobs_.at(id);
    if (entry.job.state() != v1::JOB_STATE_SCHEDULED) continue;
    for (int rank = 0; rank < static_cast<int>(entry.ranks.size()); ++rank) {
      if (entry.ranks[rank].started || now < entry.ranks[rank].start_by) continue;
      const std::string worker_id = entry.job.placement(rank).worker_id();
      const std::string why =
          absl::StrCat("rank ", rank, " did not report its start on worker ", worker_id, " within ",
                       absl::FormatDuration(options_.start_timeout));
      if (const auto worker = workers_.find(worker_id); worker != workers_.end()) {
        SetTime(worker->second.info.mutable_unhealthy_until(), now + options_.unhealthy_exclusion);
        worker->second.info.set_unhealthy_reason(why);
        (void)PersistWorker(worker->second);
        util::LogWarning("worker ", worker_id, " excluded from placement for ",
                         absl::FormatDuration(options_.unhealthy_exclusion), ": ", why);
      }
      // A failed write leaves the job as it was; the next Tick tries again.
      (void)FailAttempt(entry, why, AttemptEnd::kNotStarted);
      break;
    }
  }
}

void Coordinator::StopRanks(const v1::Job& job, const std::vector<RankState>& ranks,
                            const std::string& reason) {
  for (const auto& placement : job.placement()) {
    const int rank = placement.rank();
    const bool known = rank < static_cast<int>(ranks.size());
    if (known && ranks[rank].exited) continue;
    // Ranks 1.. of a context-parallel job wait for rank 0's address: without one, never sent.
    if (rank > 0 && job.rendezvous().empty() && !(known && ranks[rank].started)) continue;
    v1::Assignment assignment;
    auto* stop = assignment.mutable_stop();
    stop->mutable_ref()->set_job_id(job.id());
    stop->mutable_ref()->set_rank(rank);
    stop->mutable_ref()->set_attempt(job.restarts());
    stop->set_reason(reason);
    const auto worker = workers_.find(placement.worker_id());
    if (worker == workers_.end() || worker->second.info.state() != v1::WORKER_STATE_ONLINE) {
      continue;
    }
    const int flat = FlatSlot(worker->second, job, placement);
    if (flat >= 0) worker->second.stopping[{job.id(), rank, job.restarts()}] = flat;
    Send(placement.worker_id(), std::move(assignment));
  }
}

void Coordinator::Send(const std::string& worker_id, v1::Assignment assignment) {
  const auto worker = workers_.find(worker_id);
  if (worker != workers_.end() && worker->second.queue) {
    worker->second.queue->Push(std::move(assignment));
  }
}

bool Coordinator::Wanted(const v1::RankRef& ref, const std::string& worker_id) const {
  const auto found = jobs_.find(ref.job_id());
  if (found == jobs_.end()) return false;
  const v1::Job& job = found->second.job;
  if (job.state() != v1::JOB_STATE_SCHEDULED && job.state() != v1::JOB_STATE_RUNNING) return false;
  if (ref.attempt() != job.restarts()) return false;
  if (ref.rank() < 0 || ref.rank() >= job.placement_size()) return false;
  return job.placement(ref.rank()).worker_id() == worker_id;
}

absl::Status Coordinator::FailAttempt(JobEntry& entry, std::string why, AttemptEnd end) {
  const v1::Job before = entry.job;
  const std::vector<RankState> ranks = entry.ranks;
  const int uncounted = before.start_timeouts() + before.disruptions();
  const int used = before.restarts() - uncounted;
  if (end != AttemptEnd::kFailed && uncounted >= kMaxUncountedAttempts) {
    absl::StrAppend(&why, "; counted: ", uncounted, " attempts already ended without counting");
    end = AttemptEnd::kFailed;
  }
  if (end == AttemptEnd::kFailed && used >= before.max_restarts()) {
    const std::string reason =
        before.max_restarts() == 0
            ? absl::StrCat(why, " (max_restarts is 0)")
            : absl::StrCat(why, " (max_restarts ", before.max_restarts(), " used up)");
    if (auto status = Transition(entry, v1::JOB_STATE_FAILED, reason); !status.ok()) {
      return status;
    }
  } else {
    v1::Job updated = before;
    updated.set_restarts(before.restarts() + 1);
    updated.clear_placement();
    updated.clear_rendezvous();  // the next attempt's rank 0 publishes its own
    std::string reason;
    if (end == AttemptEnd::kFailed) {
      reason = absl::StrCat(why, " (restart ", used + 1, " of ", before.max_restarts(), ")");
    } else {
      if (end == AttemptEnd::kNotStarted) updated.set_start_timeouts(before.start_timeouts() + 1);
      if (end == AttemptEnd::kDisrupted) updated.set_disruptions(before.disruptions() + 1);
      reason = absl::StrCat(why, " (placed again; not counted against max_restarts)");
    }
    if (auto status = TransitionWith(entry, std::move(updated), v1::JOB_STATE_RESTARTING, reason);
        !status.ok()) {
      return status;
    }
    const int doublings = std::min(entry.job.restarts() - 1, kMaxBackoffDoublings);
    entry.restart_at = clock_->Now() + options_.restart_backoff * (int64_t{1} << doublings);
    next_restart_ = std::min(next_restart_, entry.restart_at);
    entry.ranks.clear();
  }
  StopRanks(before, ranks, why);
  return absl::OkStatus();
}

absl::Status Coordinator::MarkStarted(JobEntry& entry, int rank) {
  entry.ranks[rank].started = true;
  if (entry.job.state() != v1::JOB_STATE_SCHEDULED) return absl::OkStatus();
  for (const auto& state : entry.ranks) {
    if (!state.started) return absl::OkStatus();
  }
  return Transition(entry, v1::JOB_STATE_RUNNING,
                    absl::StrCat("all ", entry.ranks.size(), " rank(s) started"));
}

// ---------------------------------------------------------------------------------------------
// JobService

absl::Status Coordinator::ValidateSubmit(const v1::SubmitJobRequest& request) const {
  std::vector<std::string> problems;
  if (request.ByteSizeLong() > kMaxRequestBytes) {
    problems.push_back(absl::StrCat("request: ", request.ByteSizeLong(),
                                    " bytes exceeds the limit of ", kMaxRequestBytes));
  }
  if (!request.has_spec()) {
    problems.push_back("spec: required");
  } else if (auto status = ValidateJobSpec(request.spec()); !status.ok()) {
    for (absl::string_view problem : absl::StrSplit(status.message(), "; ")) {
      problems.push_back(absl::StrCat("spec.", problem));
    }
  }
  // Workers resolve and confine these paths; what can be told without their file system is told
  // here, at once.
  const v1::JobSpec& spec = request.spec();
  for (const auto& [field, path] :
       {std::pair{"spec.data.token_file.path", spec.data().token_file().path()},
        std::pair{"spec.data.text_file.path", spec.data().text_file().path()},
        std::pair{"spec.checkpoint.dir", spec.checkpoint().dir()}}) {
    if (path.empty()) continue;
    const std::filesystem::path parts(path);
    if (!parts.is_absolute() ||
        std::find(parts.begin(), parts.end(), std::filesystem::path("..")) != parts.end()) {
      problems.push_back(absl::StrCat(field, ": must be an absolute path without '..' (got '",
                                      absl::CHexEscape(path), "')"));
    }
  }
  const auto& resources = request.resources();
  if (resources.ranks() < 0 || resources.ranks() > kMaxRanks) {
    problems.push_back(absl::StrCat("resources.ranks: must be in [1, ", kMaxRanks, "] (got ",
                                    resources.ranks(), ")"));
  }
  // Every rank is one context-parallel process of the job (there is no data parallelism): a
  // MANUAL job runs context_parallel ranks, and asking for another count above 1 is a mistake.
  if (request.has_spec() && request.spec().parallelism().mode() != v1::AUTO) {
    const int degree = std::max(1, request.spec().parallelism().context_parallel());
    if (resources.ranks() > 1 && resources.ranks() != degree) {
      problems.push_back(absl::StrCat(
          "resources.ranks: must be ", degree,
          " (spec.parallelism.context_parallel: each rank is one context-parallel process) or "
          "left at 1 (got ",
          resources.ranks(), ")"));
    }
  }
  if (!v1::DeviceKind_IsValid(resources.device_kind())) {
    problems.push_back(
        absl::StrCat("resources.device_kind: unknown kind (got ", resources.device_kind(), ")"));
  }
  if (resources.memory_bytes_per_rank() < 0) {
    problems.push_back(absl::StrCat("resources.memory_bytes_per_rank: must be >= 0 (got ",
                                    resources.memory_bytes_per_rank(), ")"));
  }
  if (request.priority() < kMinPriority || request.priority() > kMaxPriority) {
    problems.push_back(absl::StrCat("priority: must be in [", kMinPriority, ", ", kMaxPriority,
                                    "] (got ", request.priority(), ")"));
  }
  if (request.max_restarts() < 0 || request.max_restarts() > kMaxRestarts) {
    problems.push_back(absl::StrCat("max_restarts: must be in [0, ", kMaxRestarts, "] (got ",
                                    request.max_restarts(), ")"));
  }
  if (request.request_id().size() > kMaxRequestIdBytes) {
    problems.push_back(absl::StrCat("request_id: must be at most ", kMaxRequestIdBytes, " bytes"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

std::string Coordinator::NewJobId() {
  for (;;) {
    char id[32];
    std::snprintf(id, sizeof(id), "job-%012llx",
                  static_cast<unsigned long long>(random_() & 0xffffffffffffULL));
    if (jobs_.count(id) == 0) return id;
  }
}

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::SubmitJobRequest& request) {
  if (auto status = ValidateSubmit(request); !status.ok()) return status;
  PlannedJob planned = Requested(request.spec(), request.resources());
  planner::DeviceProfile fleet;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fleet = PlanningProfile(planned.resources);
  }
  if (auto status = PlanWithin(fleet, ProfileFor(planned.resources), &planned); !status.ok()) {
    return status;
  }
  v1::Job job;
  *job.mutable_spec() = std::move(planned.spec);
  *job.mutable_resources() = std::move(planned.resources);
  *job.mutable_requested_spec() = request.spec();
  *job.mutable_requested_resources() = request.resources();
  job.set_priority(request.priority());
  job.set_max_restarts(request.max_restarts());
  job.set_request_id(request.request_id());

  Store::Ticket ticket;
  v1::Job answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto staged = StageSubmission(std::move(job), request);
    if (!staged.ok()) return staged.status();
    std::tie(answer, ticket) = *std::move(staged);
  }
  // Durable before it is acknowledged; the wait is outside the lock, so the submissions that
  // arrive meanwhile share the next commit.
  // (Its first event is not marked stored for watches: nobody can watch a job before knowing its
  // id, and a watch reads the store before it waits.)
  if (auto status = store_->Sync(ticket); !status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ForgetUnstored(answer.id());
    return absl::UnavailableError(
        absl::StrCat("store: ", status.message(), "; the job was not submitted"));
  }
  return answer;
}

absl::StatusOr<std::pair<v1::Job, Store::Ticket>> Coordinator::StageSubmission(
    v1::Job job, const v1::SubmitJobRequest& request) {
  if (!request.request_id().empty()) {
    const auto existing = by_request_.find(request.request_id());
    if (existing != by_request_.end()) {
      const JobEntry& prior = jobs_.at(existing->second);
      using google::protobuf::util::MessageDifferencer;
      // The request as sent decides (its plan may differ now); jobs stored without it are
      // compared as planned.
      const bool stored = prior.job.has_requested_resources();
      const bool same =
          MessageDifferencer::Equals(stored ? prior.job.requested_spec() : prior.job.spec(),
                                     stored ? request.spec() : job.spec()) &&
          MessageDifferencer::Equals(
              stored ? prior.job.requested_resources() : prior.job.resources(),
              stored ? request.resources() : job.resources()) &&
          prior.job.priority() == job.priority() && prior.job.max_restarts() == job.max_restarts();
      if (same) {
        // A retry: answered once the first submission is on disk, like the first.
        return std::make_pair(prior.job, prior.insert_ticket);
      }
      return absl::AlreadyExistsError(absl::StrCat("request_id: '", request.request_id(),
                                                   "' was used for a different request (job ",
                                                   prior.job.id(), ")"));
    }
  }
  const absl::Time now = clock_->Now();
  job.set_id(NewJobId());
  job.set_name(job.spec().name());
  job.set_state(v1::JOB_STATE_PENDING);
  // Decided before it is stored, so a job that waits is written once, with its real reason.
  // Nothing freed since the last pass: only this job can move, decided alone in O(workers)
  // (ScheduleNew says why that is what a full pass would do). Otherwise a full pass with it.
  const JobRequest queued{job.id(), job.priority(), next_order_, job.resources()};
  std::vector<Decision> decisions;
  if (PassNeeded()) {
    pass_needed_ = false;
    reasons_stale_ = false;
    std::vector<JobRequest> queue = WaitingJobs();
    queue.push_back(queued);
    decisions = server::Schedule(std::move(queue), WorkerViews(), &blocked_below_);
  } else {
    const std::optional<int> held_back = blocked_below_;
    decisions.push_back(ScheduleNew(queued, WorkerViews(), &blocked_below_));
    // Its slots change the free counts in waiting jobs' reasons; a new job holding back changes
    // who they wait behind. Placements are unaffected, so Tick refreshes the reasons later.
    if (!decisions.back().placement.empty() || blocked_below_ != held_back) reasons_stale_ = true;
  }
  const Decision& own = *std::find_if(decisions.begin(), decisions.end(),
                                      [&](const Decision& d) { return d.job_id == job.id(); });
  job.set_reason(own.placement.empty() ? own.reason : "waiting to be scheduled");
  SetTime(job.mutable_created_at(), now);
  SetTime(job.mutable_updated_at(), now);
  v1::JobEvent event;
  event.set_job_id(job.id());
  event.set_sequence(1);
  SetTime(event.mutable_time(), now);
  event.mutable_state_change()->set_to(v1::JOB_STATE_PENDING);
  event.mutable_state_change()->set_reason(job.reason());

  // Adopted now, written with the next commit: a placement below writes the job first (the
  // store keeps that order), so no rank is sent before the job is stored.
  JobEntry& entry = jobs_[job.id()];
  entry.order = next_order_++;
  entry.last_sequence = 1;
  entry.queued_at = now;
  entry.insert_ticket = store_->StageInsert(job, {event});
  entry.job = std::move(job);
  const std::string id = entry.job.id();
  by_order_[entry.order] = id;
  if (!entry.job.request_id().empty()) by_request_[entry.job.request_id()] = id;
  Track(id, entry.job.state(), +1);
  if (metrics_ != nullptr) metrics_->JobSubmitted();
  UpdateGauges();
  Apply(std::move(decisions));
  const JobEntry& placed = jobs_.at(id);
  return std::make_pair(placed.job, placed.insert_ticket);
}

void Coordinator::ForgetUnstored(const std::string& job_id) {
  const auto found = jobs_.find(job_id);
  if (found == jobs_.end() || store_->Stored(found->second.insert_ticket)) return;
  // Only a placement could have moved it, and a placement writes the job first: it is PENDING.
  JobEntry& entry = found->second;
  by_order_.erase(entry.order);
  if (!entry.job.request_id().empty()) by_request_.erase(entry.job.request_id());
  Track(job_id, entry.job.state(), -1);
  jobs_.erase(found);
  pass_needed_ = true;  // the decisions made with it in the queue are stale
  UpdateGauges();
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return found->second.job;
}

absl::StatusOr<std::vector<v1::JobEvent>> Coordinator::JobEvents(const std::string& job_id,
                                                                 int64_t after_sequence,
                                                                 int limit) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.count(job_id) == 0) {
      return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    }
  }
  // The store has its own lock; reading outside ours keeps a long read from holding up reports.
  return store_->LoadEvents(job_id, after_sequence, limit);
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  auto page_size = PageSize(request.page_size());
  if (!page_size.ok()) return page_size.status();
  // The token is the submission order of the last job returned, opaque to clients.
  int64_t before = INT64_MAX;
  if (!request.page_token().empty()) {
    std::string decoded;
    if (!absl::WebSafeBase64Unescape(request.page_token(), &decoded) ||
        !absl::SimpleAtoi(decoded, &before) || before <= 0) {
      return absl::InvalidArgumentError("page_token: not a token from ListJobs");
    }
  }
  std::set<int> states;
  for (int state : request.states()) states.insert(state);

  std::lock_guard<std::mutex> lock(mu_);
  v1::ListJobsResponse response;
  size_t page_bytes = 0;
  for (auto it = std::make_reverse_iterator(by_order_.lower_bound(before)); it != by_order_.rend();
       ++it) {
    const JobEntry& entry = jobs_.at(it->second);
    const v1::Job& job = entry.job;
    if (!states.empty() && states.count(job.state()) == 0) continue;
    if (!store_->Stored(entry.insert_ticket)) continue;  // not acknowledged yet
    const size_t job_bytes = job.ByteSizeLong();
    if (response.jobs_size() == *page_size ||
        (response.jobs_size() > 0 && page_bytes + job_bytes > kMaxPageBytes)) {
      // More remain: the next page starts after the last job returned.
      const int64_t last = jobs_.at(response.jobs(response.jobs_size() - 1).id()).order;
      response.set_next_page_token(absl::WebSafeBase64Escape(absl::StrCat(last)));
      break;
    }
    page_bytes += job_bytes;
    *response.add_jobs() = job;
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id,
                                               const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  JobEntry& entry = found->second;
  if (IsTerminal(entry.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", StateName(entry.job.state()),
                     ": only a job that has not ended can be cancelled"));
  }
  const v1::Job before = entry.job;
  const std::vector<RankState> ranks = entry.ranks;
  const std::string why = reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason);
  if (auto status = Transition(entry, v1::JOB_STATE_CANCELLED, why); !status.ok()) return status;
  if (before.state() == v1::JOB_STATE_SCHEDULED || before.state() == v1::JOB_STATE_RUNNING) {
    StopRanks(before, ranks, why);
  }
  Schedule();
  return entry.job;
}

absl::StatusOr<v1::Plan> Coordinator::PlanJob(const v1::PlanJobRequest& request) {
  v1::SubmitJobRequest as_submit;
  *as_submit.mutable_spec() = request.spec();
  *as_submit.mutable_resources() = request.resources();
  if (auto status = ValidateSubmit(as_submit); !status.ok()) return status;
  v1::JobSpec spec = request.spec();
  ApplyDefaults(&spec);
  // As SubmitJob plans: for the workers' devices, else for the profile's.
  planner::PlanOptions options;
  {
    std::lock_guard<std::mutex> lock(mu_);
    options = PlannerOptions(request.resources(), PlanningProfile(request.resources()));
  }
  planner::PlanResult result = planner::PlanJob(spec, options);
  const planner::DeviceProfile& configured = ProfileFor(request.resources());
  if (result.winner < 0 && options.profile.memory_bytes < configured.memory_bytes) {
    options.profile = configured;
    result = planner::PlanJob(spec, options);
  }

  v1::Plan plan;
  plan.set_ranks(options.gpus);
  int64_t memory = planner::EstimateMemory(spec).total_bytes;
  if (result.winner >= 0) {
    const planner::Prediction& best = result.candidates[result.winner];
    plan.set_context_parallel(best.candidate.cp);
    plan.set_cp_layout(best.candidate.cp > 1 ? CpLayoutName(best.candidate.layout) : "none");
    plan.set_query_group(best.candidate.group);
    plan.set_query_chunk(static_cast<int32_t>(best.candidate.query_chunk));
    plan.set_step_seconds(best.step_s);
    memory = static_cast<int64_t>(best.memory.total);
    for (int i = 0; i < static_cast<int>(result.stages.size()); ++i) {
      const planner::Prediction& stage = result.stages[i];
      v1::Plan::Stage* out = plan.add_stages();
      out->set_name(spec.stages(i).name());
      out->set_steps(spec.stages(i).steps());
      out->set_step_seconds(stage.step_s);
      out->set_memory_bytes_per_rank(static_cast<int64_t>(stage.memory.total));
      out->set_query_chunk(static_cast<int32_t>(stage.candidate.query_chunk));
    }
    plan.set_job_seconds(result.job_seconds);
  }
  plan.set_memory_bytes_per_rank(memory);
  for (const auto& line : result.why) plan.add_notes(line);
  for (const auto& note : result.notes) plan.add_notes(note);
  if (result.winner < 0) {
    plan.set_feasible(false);
    plan.set_reason(result.why.front());
    return plan;
  }
  // Placement as the scheduler would choose it now, for the planned ranks and, unless the
  // request names a memory requirement, the estimated memory.
  v1::Resources resources = request.resources();
  resources.set_ranks(options.gpus);
  if (resources.memory_bytes_per_rank() == 0) resources.set_memory_bytes_per_rank(memory);
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<WorkerView> views = WorkerViews();
  std::vector<WorkerView> idle = views;
  for (auto& view : idle) view.busy.clear();
  plan.set_feasible(Place(resources, idle).has_value());
  if (auto placement = Place(resources, views)) {
    for (auto& p : *placement) *plan.add_placement() = std::move(p);
  } else {
    plan.set_reason(WhyNotPlaced(resources, views));
  }
  return plan;
}

// A WatchJob call: the snapshot, then the stored events after the client's position, then new
// ones as they are stored, until the terminal one.
class Coordinator::EventStream final : public StreamSource<v1::JobEvent> {
 public:
  EventStream(Coordinator* coordinator, std::string job_id, int64_t after, v1::JobEvent snapshot)
      : coordinator_(coordinator),
        job_id_(std::move(job_id)),
        sent_(after),
        snapshot_(std::move(snapshot)) {}
  ~EventStream() override { coordinator_->Unsubscribe(job_id_, subscription_); }

  std::optional<absl::Status> Pull(std::vector<v1::JobEvent>* out,
                                   std::function<void()> wake) override {
    if (snapshot_) {
      out->push_back(*std::move(snapshot_));
      snapshot_.reset();
      return std::nullopt;
    }
    for (int read = 1;; ++read) {
      // Read outside the lock (the store has its own), so a long read holds up no report.
      auto events = coordinator_->store_->LoadEvents(job_id_, sent_, kEventBatch);
      if (!events.ok()) return events.status();
      if (!events->empty()) {
        sent_ = events->back().sequence();
        // The terminal state's event is a job's last: the watch ends with it.
        const bool last =
            events->back().has_state_change() && IsTerminal(events->back().state_change().to());
        for (auto& event : *events) out->push_back(std::move(event));
        if (last) return absl::OkStatus();
        return std::nullopt;
      }
      std::lock_guard<std::mutex> lock(coordinator_->mu_);
      if (coordinator_->shutdown_) return absl::UnavailableError("hyscaled is shutting down");
      const auto found = coordinator_->jobs_.find(job_id_);
      if (found == coordinator_->jobs_.end()) return absl::OkStatus();
      const JobEntry& entry = found->second;
      if (IsTerminal(entry.job.state()) && sent_ >= entry.last_sequence) return absl::OkStatus();
      // Committed since the read: read again (the next read sees them). Events written but not
      // yet committed (a report batch, a submission's group commit) wake the watch when they are.
      if (entry.stored_sequence > sent_) {
        if (read == 1) continue;
        return absl::DataLossError(absl::StrCat("job ", job_id_, ": events ", sent_ + 1, " to ",
                                                entry.stored_sequence, " are not in the store"));
      }
      subscription_ = coordinator_->Subscribe(job_id_, sent_, std::move(wake));
      return std::nullopt;
    }
  }

 private:
  Coordinator* const coordinator_;
  const std::string job_id_;
  int64_t sent_;
  std::optional<v1::JobEvent> snapshot_;
  uint64_t subscription_ = 0;
};

// A StreamLogs call: a rank's log from an offset; following, until the job has ended and every
// byte it wrote is sent.
class Coordinator::LogStream final : public StreamSource<v1::LogChunk> {
 public:
  LogStream(Coordinator* coordinator, const v1::StreamLogsRequest& request)
      : coordinator_(coordinator),
        job_id_(request.job_id()),
        rank_(request.rank()),
        follow_(request.follow()),
        path_(coordinator->LogPath(request.job_id(), request.rank())),
        offset_(request.offset()) {}
  ~LogStream() override { coordinator_->Unsubscribe(job_id_, subscription_); }

  std::optional<absl::Status> Pull(std::vector<v1::LogChunk>* out,
                                   std::function<void()> wake) override {
    for (;;) {
      // Whether the job had ended before this read (then the read sees every byte there will
      // be), and how many appends it had seen.
      bool ended;
      int64_t appends;
      {
        std::lock_guard<std::mutex> lock(coordinator_->mu_);
        if (coordinator_->shutdown_) return absl::UnavailableError("hyscaled is shutting down");
        const auto found = coordinator_->jobs_.find(job_id_);
        if (found == coordinator_->jobs_.end()) return absl::OkStatus();
        ended = IsTerminal(found->second.job.state());
        appends = found->second.log_appends;
      }
      if (ReadSome(out) > 0) return std::nullopt;
      if (!follow_ || ended) return absl::OkStatus();
      std::lock_guard<std::mutex> lock(coordinator_->mu_);
      const JobEntry& entry = coordinator_->jobs_.at(job_id_);
      if (entry.log_appends != appends || IsTerminal(entry.job.state())) continue;
      subscription_ = coordinator_->Subscribe(job_id_, kLogsOnly, std::move(wake));
      return std::nullopt;
    }
  }

 private:
  // Up to kLogChunksPerPull chunks from offset_; the bytes read.
  int64_t ReadSome(std::vector<v1::LogChunk>* out) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return 0;
    in.seekg(offset_);
    int64_t total = 0;
    std::string buffer(kLogChunkBytes, '\0');
    for (int i = 0; i < kLogChunksPerPull && in.good(); ++i) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const std::streamsize got = in.gcount();
      if (got <= 0) break;
      v1::LogChunk chunk;
      chunk.set_rank(rank_);
      chunk.set_offset(offset_);
      chunk.set_data(buffer.data(), static_cast<size_t>(got));
      out->push_back(std::move(chunk));
      offset_ += got;
      total += got;
    }
    return total;
  }

  Coordinator* const coordinator_;
  const std::string job_id_;
  const int rank_;
  const bool follow_;
  const std::string path_;
  int64_t offset_;
  uint64_t subscription_ = 0;
};

absl::StatusOr<std::unique_ptr<StreamSource<v1::JobEvent>>> Coordinator::WatchJob(
    const v1::WatchJobRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = jobs_.find(request.job_id());
  if (found == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  }
  const v1::Job& job = found->second.job;
  v1::JobEvent snapshot;
  snapshot.set_job_id(job.id());
  SetTime(snapshot.mutable_time(), clock_->Now());
  snapshot.mutable_state_change()->set_from(job.state());
  snapshot.mutable_state_change()->set_to(job.state());
  snapshot.mutable_state_change()->set_reason(job.reason());
  snapshot.mutable_state_change()->set_restarts(job.restarts());
  return std::make_unique<EventStream>(
      this, job.id(), std::max<int64_t>(request.after_sequence(), 0), std::move(snapshot));
}

absl::StatusOr<std::unique_ptr<StreamSource<v1::LogChunk>>> Coordinator::StreamLogs(
    const v1::StreamLogsRequest& request) {
  if (request.offset() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset: must be >= 0 (got ", request.offset(), ")"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = jobs_.find(request.job_id());
  if (found == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  }
  const int ranks = found->second.job.resources().ranks();
  if (request.rank() < 0 || request.rank() >= ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, ", ranks, ") (got ", request.rank(), ")"));
  }
  return std::make_unique<LogStream>(this, request);
}

uint64_t Coordinator::Subscribe(const std::string& job_id, int64_t after_sequence,
                                std::function<void()> wake) {
  const uint64_t id = next_subscription_++;
  subscriptions_[job_id][id] = Subscription{after_sequence, std::move(wake)};
  return id;
}

void Coordinator::Unsubscribe(const std::string& job_id, uint64_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = subscriptions_.find(job_id);
  if (found == subscriptions_.end()) return;
  found->second.erase(id);
  if (found->second.empty()) subscriptions_.erase(found);
}

void Coordinator::EventsStored(JobEntry& entry, int64_t sequence) {
  if (sequence <= entry.stored_sequence) return;
  entry.stored_sequence = sequence;
  WakeStreams(entry.job.id(), /*log_grew=*/false);
}

void Coordinator::WakeStreams(const std::string& job_id, bool log_grew) {
  const auto found = subscriptions_.find(job_id);
  if (found == subscriptions_.end()) return;
  const auto job = jobs_.find(job_id);
  const int64_t stored = job == jobs_.end() ? 0 : job->second.stored_sequence;
  auto& waiting = found->second;
  for (auto it = waiting.begin(); it != waiting.end();) {
    const bool logs = it->second.after_sequence == kLogsOnly;
    // Log streams also wake on events: the job's end ends them.
    if (logs ? true : (!log_grew && stored > it->second.after_sequence)) {
      it->second.wake();
      it = waiting.erase(it);
    } else {
      ++it;
    }
  }
  if (waiting.empty()) subscriptions_.erase(found);
}

// ---------------------------------------------------------------------------------------------
// WorkerService

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("name: required");
  if (request.name().size() > kMaxNameBytes || request.address().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name, address: must be at most ", kMaxNameBytes, " bytes"));
  }
  int64_t slots = 0;
  for (const auto& device : request.devices()) slots += std::max(0, device.count());
  if (slots > kMaxWorkerSlots) {
    return absl::InvalidArgumentError(absl::StrCat("devices: at most ", kMaxWorkerSlots,
                                                   " devices per worker (got ", slots, ")"));
  }
  for (int i = 0; i < request.devices_size(); ++i) {
    const auto& device = request.devices(i);
    if (device.count() < 1 || device.count() > kMaxRanks) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "].count: must be in [1, ",
                                                     kMaxRanks, "] (got ", device.count(), ")"));
    }
    if (device.name().size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "].name: must be at most ", kMaxNameBytes, " bytes"));
    }
    if (device.memory_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "].memory_bytes: must be >= 0"));
    }
    if (!v1::DeviceKind_IsValid(device.kind()) || device.kind() == v1::DEVICE_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "].kind: must be CPU or GPU"));
    }
  }
  if (request.instance().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("instance: must be at most ", kMaxNameBytes, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  if (const auto held = workers_.find(request.name());
      held != workers_.end() && held->second.info.state() == v1::WORKER_STATE_ONLINE &&
      !held->second.instance.empty() && held->second.instance != request.instance()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "name: worker '", absl::CHexEscape(request.name()),
        "' is held by another live agent; it is free once that one is lost (no heartbeat for ",
        absl::FormatDuration(options_.heartbeat_timeout), ")"));
  }
  WorkerEntry& worker = workers_[request.name()];
  worker.instance = request.instance();
  worker.heard = true;
  worker.left = false;
  worker.info.set_id(request.name());
  worker.info.set_address(request.address());
  worker.info.set_state(v1::WORKER_STATE_ONLINE);
  *worker.info.mutable_devices() = request.devices();
  *worker.info.mutable_running() = request.running();
  SetTime(worker.info.mutable_last_heartbeat(), now);
  worker.last_seen = now;
  worker.slots = SlotsOf(request.devices());
  worker.stopping.clear();
  pass_needed_ = true;  // its devices (maybe changed, maybe freed) are capacity
  fleet_changed_ = true;

  v1::RegisterWorkerResponse response;
  response.set_worker_id(request.name());
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  // Ranks it runs that we still want keep running; the others are stopped (their slots stay
  // busy until the worker stops reporting them).
  for (const auto& ref : request.running()) {
    if (Wanted(ref, request.name())) {
      // A failed write is retried by the next heartbeat, which reports the rank again.
      (void)MarkStarted(jobs_.at(ref.job_id()), ref.rank());
      continue;
    }
    *response.add_stop() = ref;
    const auto job = jobs_.find(ref.job_id());
    if (job != jobs_.end() && ref.rank() >= 0 && ref.rank() < job->second.job.placement_size()) {
      const int flat = FlatSlot(worker, job->second.job, job->second.job.placement(ref.rank()));
      if (flat >= 0) worker.stopping[{ref.job_id(), ref.rank(), ref.attempt()}] = flat;
    }
  }
  // Ranks we believe started here that the worker no longer runs have exited unseen. (A copy:
  // FailAttempt takes jobs out of placed_.)
  for (const std::string& id : std::vector<std::string>(placed_.begin(), placed_.end())) {
    JobEntry& entry = jobs_.at(id);
    const v1::JobState state = entry.job.state();
    if (state != v1::JOB_STATE_SCHEDULED && state != v1::JOB_STATE_RUNNING) continue;
    for (const auto& placement : entry.job.placement()) {
      if (placement.worker_id() != request.name()) continue;
      const RankState& rank = entry.ranks[placement.rank()];
      if (!rank.started || rank.exited) continue;
      const bool reported = std::any_of(
          request.running().begin(), request.running().end(), [&](const v1::RankRef& ref) {
            return ref.job_id() == id && ref.rank() == placement.rank() &&
                   ref.attempt() == entry.job.restarts();
          });
      if (reported) continue;
      entry.ranks[placement.rank()].exited = true;
      (void)FailAttempt(entry,
                        absl::StrCat("rank ", placement.rank(), " is no longer running on worker ",
                                     request.name(), " after it re-registered"));
      break;
    }
  }
  if (auto status = PersistWorker(worker); !status.ok()) return status;
  Schedule();
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::HeartbeatResponse response;
  WorkerEntry* const holder = Holder(request.worker_id(), request.instance());
  if (holder == nullptr) {
    response.set_registered(false);
    return response;
  }
  WorkerEntry& worker = *holder;
  response.set_registered(true);
  if (request.leaving() && request.running().empty()) {
    // Its agent stopped cleanly: the name is free now, not after the heartbeat timeout.
    util::LogInfo("worker ", worker.info.id(), " left: its agent stopped");
    worker.left = true;
    DeclareLost(worker);
    RestartJobsOnLostWorkers();
    Schedule();
    return response;
  }
  const absl::Time now = clock_->Now();
  worker.last_seen = now;
  // Restored and heard from now: its free devices are capacity again.
  bool freed = !std::exchange(worker.heard, true);
  SetTime(worker.info.mutable_last_heartbeat(), now);
  *worker.info.mutable_running() = request.running();
  for (const auto& ref : request.running()) {
    if (Wanted(ref, worker.info.id())) {
      JobEntry& entry = jobs_.at(ref.job_id());
      if (!entry.ranks[ref.rank()].started) (void)MarkStarted(entry, ref.rank());
    } else {
      *response.add_stop() = ref;
    }
  }
  // A stopped rank's slot is free once the worker no longer reports it.
  for (auto it = worker.stopping.begin(); it != worker.stopping.end();) {
    const auto& [job_id, rank, attempt] = it->first;
    const bool still = std::any_of(
        request.running().begin(), request.running().end(), [&](const v1::RankRef& ref) {
          return ref.job_id() == job_id && ref.rank() == rank && ref.attempt() == attempt;
        });
    if (still) {
      ++it;
    } else {
      it = worker.stopping.erase(it);
      freed = true;
    }
  }
  if (freed) {
    pass_needed_ = true;
    Schedule();
  }
  return response;
}

absl::StatusOr<std::shared_ptr<AssignmentQueue>> Coordinator::OpenAssignments(
    const v1::StreamAssignmentsRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerEntry* const holder = Holder(request.worker_id(), request.instance());
  if (holder == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker_id: ", request.worker_id(), " is not registered; call RegisterWorker first"));
  }
  WorkerEntry& worker = *holder;
  if (worker.queue) worker.queue->Close();
  worker.queue = std::make_shared<AssignmentQueue>();
  if (shutdown_) worker.queue->Close();
  for (const std::string& id : placed_) {
    const JobEntry& entry = jobs_.at(id);
    for (const auto& placement : entry.job.placement()) {
      if (placement.worker_id() != request.worker_id() || !Sendable(entry.job, placement.rank()))
        continue;
      v1::RunRank run = MakeRunRank(entry, placement);
      const bool running =
          std::any_of(worker.info.running().begin(), worker.info.running().end(),
                      [&](const v1::RankRef& ref) { return SameRef(ref, run.ref()); });
      if (running || entry.ranks[placement.rank()].exited) continue;
      v1::Assignment assignment;
      *assignment.mutable_run() = std::move(run);
      worker.queue->Push(std::move(assignment));
    }
  }
  return worker.queue;
}

absl::Status Coordinator::ReportStatus(const v1::ReportStatusRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerEntry* const holder = Holder(request.worker_id(), request.instance());
  if (holder == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker_id: ", request.worker_id(), " is not registered; call RegisterWorker first"));
  }
  holder->last_seen = clock_->Now();
  // The batch's jobs as they were: a report applies its change in memory as soon as it is written
  // into the batch, so a batch that is not stored must take those changes back.
  std::map<std::string, JobEntry> before;
  Store::Batch batch(*store_);
  in_batch_ = true;
  absl::Status stored;
  for (const auto& report : request.reports()) {
    const std::string& job_id = report.ref().job_id();
    if (const auto found = jobs_.find(job_id); found != jobs_.end() && !before.count(job_id)) {
      before.emplace(job_id, found->second);
    }
    stored = HandleReport(*holder, report);
    if (!stored.ok()) break;
  }
  if (stored.ok()) stored = batch.Commit();
  in_batch_ = false;
  const std::set<std::string> written = std::move(batch_jobs_);
  batch_jobs_.clear();
  if (!stored.ok()) {
    // Not stored, so not applied: the agent keeps the batch and sends it again.
    Restore(std::move(before));
    FinishPublished(false);
    Schedule();
    return absl::UnavailableError(
        absl::StrCat("store: ", stored.message(), "; send the reports again"));
  }
  for (const std::string& job_id : written) {
    JobEntry& entry = jobs_.at(job_id);
    EventsStored(entry, entry.last_sequence);
  }
  FinishPublished(true);
  Schedule();
  return absl::OkStatus();
}

void Coordinator::Restore(std::map<std::string, JobEntry> before) {
  for (auto& [job_id, entry] : before) {
    JobEntry& now = jobs_.at(job_id);
    if (now.job.state() != entry.job.state()) {
      Track(job_id, now.job.state(), -1);
      Track(job_id, entry.job.state(), +1);
    }
    now = std::move(entry);
  }
  pass_needed_ = true;  // what the undone reports freed or took is as it was
  UpdateGauges();
}

absl::Status Coordinator::HandleReport(WorkerEntry& worker, const v1::RankReport& report) {
  const v1::RankRef& ref = report.ref();
  if (report.has_exited() && worker.stopping.erase({ref.job_id(), ref.rank(), ref.attempt()}) > 0) {
    pass_needed_ = true;  // its slot is free
  }
  const auto found = jobs_.find(ref.job_id());
  if (found == jobs_.end()) return absl::OkStatus();
  JobEntry& entry = found->second;
  const v1::Job& job = entry.job;
  if (ref.rank() < 0 || ref.rank() >= job.resources().ranks()) return absl::OkStatus();
  // A rank's output is kept whatever its attempt: it is what a user debugging a restart needs.
  if (report.kind_case() == v1::RankReport::kLog) {
    AppendLog(job.id(), ref.rank(), report.log());
    return absl::OkStatus();
  }
  // Only the current attempt, on the worker it was placed on, moves the job.
  if (IsTerminal(job.state()) || !Wanted(ref, worker.info.id())) return absl::OkStatus();
  switch (report.kind_case()) {
    case v1::RankReport::kStartedPid:
      return MarkStarted(entry, ref.rank());
    case v1::RankReport::kEventJson: {
      auto event = ParseTrainerEvent(ref.rank(), report.event_json());
      if (!event.ok()) {
        util::LogWarning("job ", job.id(), " rank ", ref.rank(), ": ", event.status().message());
        return absl::OkStatus();  // a bad line is dropped, not retried
      }
      const v1::TrainerEventLine& line = event->trainer().event();
      if (line.has_rendezvous() && ref.rank() == 0) {
        return PublishRendezvous(entry, *std::move(event));
      }
      if (line.has_stage_started() && ref.rank() == 0) ExportStagePlan(job, line.stage_started());
      v1::Job updated = job;
      if (line.has_step() && ref.rank() == 0) {
        const v1::TrainerEventLine::Step& step = line.step();
        auto* progress = updated.mutable_progress();
        progress->set_step(step.step());
        progress->set_total_steps(step.total_steps());
        progress->set_stage(step.stage());
        progress->set_loss(step.loss());
        progress->set_tokens_per_second(step.tokens_per_second());
        progress->set_eta_seconds(step.eta_seconds());
        if (step.has_evaluation()) {
          progress->set_accuracy(step.evaluation().accuracy());
          progress->set_indexer_recall(step.evaluation().indexer_recall());
        }
        if (metrics_ != nullptr) metrics_->Step(job.id(), step);
      }
      return Commit(entry, std::move(updated), {std::move(*event)});
    }
    case v1::RankReport::kExited:
      return HandleExit(entry, ref.rank(), report.exited());
    default:
      return absl::OkStatus();
  }
}

absl::Status Coordinator::HandleExit(JobEntry& entry, int rank, const v1::RankExit& exit) {
  entry.ranks[rank].exited = true;
  if (exit.exit_code() == kExitOk) {
    entry.ranks[rank].succeeded = true;
    for (const auto& state : entry.ranks) {
      if (!state.succeeded) return absl::OkStatus();
    }
    return Transition(entry, v1::JOB_STATE_SUCCEEDED,
                      absl::StrCat("all ", entry.ranks.size(), " rank(s) finished"));
  }
  const std::string why = DescribeExit(rank, exit);
  if (exit.exit_code() == kExitBadInput || exit.exit_code() == kExitOutOfMemory) {
    // Bad input, or a job too big for its devices, fails the same way on every attempt: no
    // restart.
    const v1::Job before = entry.job;
    const std::vector<RankState> ranks = entry.ranks;
    auto status = Transition(
        entry, v1::JOB_STATE_FAILED,
        absl::StrCat(why, exit.exit_code() == kExitBadInput
                              ? " (bad input)"
                              : " (out of memory: not restarted; give each rank more memory or "
                                "the job more ranks)"));
    if (status.ok()) StopRanks(before, ranks, why);
    return status;
  }
  // Stopped by its agent's clean shutdown (a drained node, a replaced pod): not the job's fault.
  return FailAttempt(entry, why,
                     exit.worker_stopping() ? AttemptEnd::kDisrupted : AttemptEnd::kFailed);
}

void Coordinator::AppendLog(const std::string& job_id, int rank, const std::string& data) {
  const std::string path = LogPath(job_id, rank);
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) {
    util::LogError(path, ": cannot append the log");
    return;
  }
  ++jobs_.at(job_id).log_appends;
  WakeStreams(job_id, /*log_grew=*/true);
}

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkers(
    const v1::ListWorkersRequest& request) {
  auto page_size = PageSize(request.page_size());
  if (!page_size.ok()) return page_size.status();
  // The token is the id of the last worker returned, opaque to clients.
  std::string after;
  if (!request.page_token().empty() && !absl::WebSafeBase64Unescape(request.page_token(), &after)) {
    return absl::InvalidArgumentError("page_token: not a token from ListWorkers");
  }
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListWorkersResponse response;
  size_t page_bytes = 0;
  for (auto it = after.empty() ? workers_.begin() : workers_.upper_bound(after);
       it != workers_.end(); ++it) {
    const size_t worker_bytes = it->second.info.ByteSizeLong();
    if (response.workers_size() == *page_size ||
        (response.workers_size() > 0 && page_bytes + worker_bytes > kMaxPageBytes)) {
      const std::string& last = response.workers(response.workers_size() - 1).id();
      response.set_next_page_token(absl::WebSafeBase64Escape(last));
      break;
    }
    page_bytes += worker_bytes;
    *response.add_workers() = it->second.info;
  }
  return response;
}

void Coordinator::DeclareLost(WorkerEntry& worker) {
  const std::string id = worker.info.id();
  worker.info.set_state(v1::WORKER_STATE_LOST);
  pass_needed_ = true;  // a job it held back for may never fit now, so others may start
  fleet_changed_ = true;
  worker.info.clear_running();
  worker.stopping.clear();
  if (worker.queue) {
    worker.queue->Close();
    worker.queue.reset();
  }
  (void)PersistWorker(worker);
}

void Coordinator::RestartJobsOnLostWorkers() {
  // A copy: FailAttempt takes jobs out of placed_.
  for (const std::string& id : std::vector<std::string>(placed_.begin(), placed_.end())) {
    JobEntry& entry = jobs_.at(id);
    const v1::JobState state = entry.job.state();
    if (state != v1::JOB_STATE_SCHEDULED && state != v1::JOB_STATE_RUNNING) continue;
    for (const auto& placement : entry.job.placement()) {
      const auto worker = workers_.find(placement.worker_id());
      if (worker != workers_.end() && worker->second.info.state() == v1::WORKER_STATE_ONLINE) {
        continue;
      }
      const bool left = worker != workers_.end() && worker->second.left;
      const std::string why =
          worker == workers_.end()
              ? absl::StrCat("worker ", placement.worker_id(), " is not registered")
          : left ? absl::StrCat("worker ", placement.worker_id(), " left: its agent stopped")
                 : absl::StrCat("worker ", placement.worker_id(), " lost: no heartbeat for ",
                                absl::ToInt64Milliseconds(options_.heartbeat_timeout), " ms");
      // A worker that left cleanly, or went before the rank started, did not fail the job; a
      // lost worker with the rank running might have (a trainer that takes its node down).
      const size_t rank = static_cast<size_t>(placement.rank());
      const bool started = rank < entry.ranks.size() && entry.ranks[rank].started;
      // A failed write leaves the job as it was; the next Tick tries again.
      (void)FailAttempt(entry, why,
                        left || !started ? AttemptEnd::kDisrupted : AttemptEnd::kFailed);
      break;
    }
  }
}

void Coordinator::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  for (auto& [id, worker] : workers_) {
    if (worker.info.state() == v1::WORKER_STATE_ONLINE &&
        now - worker.last_seen > options_.heartbeat_timeout) {
      DeclareLost(worker);
    }
  }
  RestartJobsOnLostWorkers();
  ExpireRendezvous();
  ExpireStarts();
  if (PassNeeded() || reasons_stale_) SchedulePass();
  if (metrics_ != nullptr) metrics_->Expire(now);
}

void Coordinator::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  for (auto& [id, worker] : workers_) {
    if (worker.queue) worker.queue->Close();
  }
  for (auto& [job_id, waiting] : subscriptions_) {
    for (auto& [id, subscription] : waiting) subscription.wake();
  }
  subscriptions_.clear();
}

std::string Coordinator::LogPath(const std::string& job_id, int rank) const {
  return (std::filesystem::path(options_.data_dir) / "logs" / job_id /
          absl::StrCat("rank", rank, ".log"))
      .string();
}

std::string Coordinator::CheckpointDir(const std::string& job_id) const {
  const std::string root = options_.checkpoint_root.empty()
                               ? (std::filesystem::path(options_.data_dir) / "checkpoints").string()
                               : options_.checkpoint_root;
  return (std::filesystem::path(root) / job_id).string();
}

}  // namespace hyscale::server
