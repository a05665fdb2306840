#include "worker/agent/agent.h"

#include <absl/strings/str_cat.h>

#include <random>
#include <utility>

#include "proto/constants.h"
#include "util/log.h"
#include "worker/agent/devices.h"

namespace hyscale::agent {
namespace {

using std::chrono::milliseconds;

constexpr size_t kMaxBatchReports = 512;
constexpr size_t kMaxBatchBytes = 2 << 20;
// Reports kept while the coordinator is unreachable (see ReportQueue).
constexpr size_t kMaxQueuedBytes = 64 << 20;
// Extra time, beyond the stop grace, for a killed trainer to be reaped.
constexpr milliseconds kReapSlack{2000};
// The exit code of a rank whose trainer did not start: kExitBadInput (not retried) when the job
// itself is at fault (a path outside the allowed folders), else 127 (as a shell reports it).
constexpr int kExitCannotStart = 127;

// 128 random bits in hex.
std::string NewInstance() {
  std::random_device random;
  std::string instance;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&instance, absl::Hex(random(), absl::kZeroPad8));
  return instance;
}

// An exit reason cut to what the coordinator takes (4096 bytes a field, server/request_limits.h):
// a longer one (a long stop reason, a trainer's long error) would get the whole report batch,
// exit included, refused.
constexpr size_t kMaxReasonBytes = 2048;
std::string Shortened(const std::string& reason) {
  if (reason.size() <= kMaxReasonBytes) return reason;
  size_t cut = kMaxReasonBytes;
  while (cut > 0 && (static_cast<unsigned char>(reason[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
  return reason.substr(0, cut) + "...";
}

std::string Describe(const v1::RankRef& ref) {
  return absl::StrCat("job ", ref.job_id(), " rank ", ref.rank(), " attempt ", ref.attempt());
}

std::string Describe(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

}  // namespace

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      paths_(options_.data_roots.empty() ? std::vector<std::string>{options_.work_dir + "/data"}
                                         : options_.data_roots,
             options_.checkpoint_roots.empty() ? std::vector<std::string>{options_.work_dir}
                                               : options_.checkpoint_roots),
      instance_(NewInstance()),
      reports_(kMaxBatchReports, kMaxBatchBytes, kMaxQueuedBytes),
      heartbeat_interval_(options_.heartbeat_interval) {}

Agent::~Agent() {
  Shutdown();
  std::map<RankKey, Rank> ranks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks.swap(ranks_);
  }
}

Agent::RankKey Agent::KeyOf(const v1::RankRef& ref) {
  return {ref.job_id(), ref.rank(), ref.attempt()};
}

void Agent::PrepareCall(grpc::ClientContext* context) const {
  rpc::PrepareCall(context, options_.client);
}

absl::Status Agent::Run() {
  auto channel = rpc::Connect(options_.client);
  if (!channel.ok()) return channel.status();
  stub_ = v1::WorkerService::NewStub(*channel);
  // The coordinator places their ranks again: left running, they would train beside the new ones.
  for (const pid_t pid : EndLeftoverTrainers(options_.work_dir)) {
    util::LogInfo("ended trainer process group ", pid, " left by a previous agent");
  }

  std::thread heartbeat([this] { HeartbeatLoop(); });
  std::thread reporter([this] { ReportLoop(); });
  Backoff backoff(options_.backoff_initial, options_.backoff_max);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) break;
    }
    if (auto status = Register(); !status.ok()) {
      if (!SleepFor(milliseconds(0))) break;  // shutting down: the cancelled call is no error
      util::LogWarning("cannot register with ", options_.client.server, ": ", status.ToString());
      SleepFor(backoff.Next());
      continue;
    }
    const auto open_for = ServeAssignments();
    // A stream that stayed up a while was a healthy connection: start the backoff over.
    if (open_for >= options_.backoff_max) backoff.Reset();
    SleepFor(backoff.Next());
  }

  StopAllTrainers();
  // Deliver the exits (and whatever else is queued) while the coordinator still listens.
  const auto drain_deadline = std::chrono::steady_clock::now() + options_.client.timeout;
  while (std::chrono::steady_clock::now() < drain_deadline &&
         (reports_.size() > 0 || !Running().empty())) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    reporter_done_ = true;
  }
  cv_.notify_all();
  reports_.Close();
  heartbeat.join();
  reporter.join();
  if (const size_t left = reports_.size(); left > 0) {
    util::LogWarning("shutting down with ", left, " reports undelivered");
  }
  Leave();
  if (const size_t dropped = reports_.dropped(); dropped > 0) {
    util::LogWarning(dropped,
                     " log and event reports were dropped while the coordinator was unreachable");
  }
  return absl::OkStatus();
}

void Agent::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  if (stream_context_ != nullptr) stream_context_->TryCancel();
  if (register_context_ != nullptr) register_context_->TryCancel();
  cv_.notify_all();
}

std::vector<v1::RankRef> Agent::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::RankRef> running;
  for (const auto& [key, rank] : ranks_) running.push_back(rank.ref);
  return running;
}

bool Agent::SleepFor(milliseconds duration) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, duration, [this] { return shutting_down_; });
}

absl::Status Agent::Register() {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_address(options_.address);
  request.set_instance(instance_);
  for (const auto& device : options_.devices) *request.add_devices() = device;
  const auto running = Running();
  for (const auto& ref : running) *request.add_running() = ref;

  grpc::ClientContext context;
  PrepareCall(&context);
  // Wait (within the deadline) for the channel to connect: a call that fails fast reports the
  // last connection error for as long as the channel backs off, well after the coordinator is
  // back.
  context.set_wait_for_ready(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::CancelledError("shutting down");
    register_context_ = &context;
  }
  v1::RegisterWorkerResponse response;
  const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  {
    std::lock_guard<std::mutex> lock(mu_);
    register_context_ = nullptr;
  }
  if (!status.ok()) return rpc::FromGrpc(status);
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker_id_ = response.worker_id().empty() ? options_.name : response.worker_id();
    if (response.heartbeat_interval_ms() > 0) {
      heartbeat_interval_ = milliseconds(response.heartbeat_interval_ms());
    }
    registered_ = true;
    util::LogInfo("registered as ", worker_id_, " with ", options_.client.server, ": ",
                  DescribeDevices(options_.devices), ", ", running.size(), " ranks running");
  }
  cv_.notify_all();
  for (const auto& ref : response.stop()) StopRank(ref, "stopped by the coordinator");
  return absl::OkStatus();
}

std::chrono::steady_clock::duration Agent::ServeAssignments() {
  const auto opened = std::chrono::steady_clock::now();
  grpc::ClientContext context;
  // No deadline: the stream lives as long as the registration. Channel keepalives detect a dead
  // coordinator, and heartbeats a coordinator that forgot us.
  rpc::PrepareCall(&context, options_.client, milliseconds(0));
  v1::StreamAssignmentsRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_ || !registered_) return {};
    stream_context_ = &context;
    request.set_worker_id(worker_id_);
    request.set_instance(instance_);
  }
  auto reader = stub_->StreamAssignments(&context, request);
  v1::Assignment assignment;
  while (reader->Read(&assignment)) {
    if (assignment.has_run()) RunRank(assignment.run());
    if (assignment.has_stop()) StopRank(assignment.stop().ref(), assignment.stop().reason());
  }
  const grpc::Status status = reader->Finish();
  bool shutting_down;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_context_ = nullptr;
    shutting_down = shutting_down_;
    // Registered again before anything else is sent: the coordinator may have restarted. While
    // shutting down the registration stays, so the final reports still go out.
    if (!shutting_down) registered_ = false;
  }
  if (!shutting_down) {
    util::LogWarning("assignment stream ended (", Describe(status), "); reconnecting");
  }
  return std::chrono::steady_clock::now() - opened;
}

void Agent::Leave() {
  std::string worker_id;
  milliseconds interval;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!registered_) return;
    worker_id = worker_id_;
    interval = heartbeat_interval_;
  }
  // A trainer that outlived StopAllTrainers still runs here: leaving would let its rank be
  // placed again while it trains, so the lease runs out as for a lost agent instead.
  if (!Running().empty()) return;
  v1::HeartbeatRequest request;
  request.set_worker_id(worker_id);
  request.set_instance(instance_);
  request.set_leaving(true);
  grpc::ClientContext context;
  // Bounded as a heartbeat is: an unreachable coordinator delays the agent's exit no longer.
  rpc::PrepareCall(&context, options_.client, std::min(options_.client.timeout, interval * 2));
  v1::HeartbeatResponse response;
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) {
    util::LogWarning("could not tell ", options_.client.server, " that worker ", worker_id,
                     " leaves (", Describe(status),
                     "): its name is held until it is declared lost");
  }
}

void Agent::Reconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  registered_ = false;
  if (stream_context_ != nullptr) stream_context_->TryCancel();
}

void Agent::HeartbeatLoop() {
  bool last_ok = true;
  while (true) {
    milliseconds interval;
    std::string worker_id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      interval = heartbeat_interval_;
    }
    if (!SleepFor(interval)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!registered_) continue;
      worker_id = worker_id_;
    }
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(instance_);
    for (const auto& ref : Running()) *request.add_running() = ref;
    grpc::ClientContext context;
    rpc::PrepareCall(&context, options_.client, std::min(options_.client.timeout, interval * 2));
    v1::HeartbeatResponse response;
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (!status.ok()) {
      if (last_ok) util::LogWarning("heartbeat failed: ", Describe(status));
      last_ok = false;
      continue;
    }
    last_ok = true;
    if (!response.registered()) {
      util::LogWarning("the coordinator does not know worker ", worker_id, "; registering again");
      Reconnect();
      continue;
    }
    for (const auto& ref : response.stop()) StopRank(ref, "stopped by the coordinator");
  }
}

void Agent::ReportLoop() {
  Backoff backoff(options_.backoff_initial, options_.backoff_max);
  while (true) {
    std::string worker_id;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, milliseconds(500), [this] { return registered_ || reporter_done_; });
      if (reporter_done_ && (!registered_ || reports_.size() == 0)) return;
      if (!registered_) continue;
      worker_id = worker_id_;
    }
    auto batch = reports_.TakeBatch(milliseconds(500), options_.report_linger);
    if (batch.empty()) continue;

    v1::ReportStatusRequest request;
    request.set_worker_id(worker_id);
    request.set_instance(instance_);
    for (const auto& report : batch) *request.add_reports() = report;
    grpc::ClientContext context;
    PrepareCall(&context);
    v1::ReportStatusResponse response;
    const grpc::Status status = stub_->ReportStatus(&context, request, &response);
    if (status.ok()) {
      backoff.Reset();
      Delivered(batch);
      continue;
    }
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      // Retrying cannot help a report the coordinator rejects; keep the rest flowing.
      util::LogError("coordinator rejected ", batch.size(), " reports: ", Describe(status));
      Delivered(batch);
      continue;
    }
    reports_.PutBack(std::move(batch));
    util::LogWarning("cannot deliver reports (", Describe(status), "); will retry");
    if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      Reconnect();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, backoff.Next(), [this] { return reporter_done_; });
  }
}

void Agent::Delivered(const std::vector<v1::RankReport>& batch) {
  std::vector<std::shared_ptr<TrainerProcess>> finished;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& report : batch) {
    if (!report.has_exited()) continue;
    auto found = ranks_.find(KeyOf(report.ref()));
    if (found == ranks_.end()) continue;
    finished.push_back(std::move(found->second.process));
    ranks_.erase(found);
  }
}

void Agent::Report(const v1::RankRef& ref, v1::RankReport report) {
  *report.mutable_ref() = ref;
  reports_.Push(std::move(report));
}

void Agent::RunRank(const v1::RunRank& run) {
  const v1::RankRef ref = run.ref();
  std::vector<std::shared_ptr<TrainerProcess>> superseded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    if (ranks_.count(KeyOf(ref)) > 0) {
      util::LogWarning(Describe(ref), " is already running; assignment ignored");
      return;
    }
    // An older attempt of the same rank must not train (and checkpoint) alongside the new one.
    for (auto& [key, rank] : ranks_) {
      if (rank.ref.job_id() == ref.job_id() && rank.ref.rank() == ref.rank() && rank.process) {
        rank.process->Stop(absl::StrCat("superseded by attempt ", ref.attempt()),
                           options_.stop_grace, TrainerProcess::StopCause::kCoordinator);
        superseded.push_back(rank.process);
      }
    }
  }
  for (const auto& process : superseded) process->WaitForExit(options_.stop_grace + kReapSlack);

  RankSetup setup{options_.work_dir, options_.trainer_path,
                  SlotCount(options_.devices, v1::DEVICE_KIND_GPU) > 0, paths_, options_.run_as};
  auto command = PrepareRank(run, setup);
  TrainerProcess::Callbacks callbacks;
  callbacks.on_start = [this, ref](pid_t pid) {
    v1::RankReport report;
    report.set_started_pid(pid);
    Report(ref, std::move(report));
  };
  callbacks.on_event = [this, ref](const std::string& line) {
    v1::RankReport report;
    report.set_event_json(line);
    Report(ref, std::move(report));
  };
  callbacks.on_log = [this, ref](const std::string& chunk) {
    v1::RankReport report;
    report.set_log(chunk);
    Report(ref, std::move(report));
  };
  callbacks.on_exit = [this, ref](const TrainerExit& exit) {
    util::LogInfo(Describe(ref), " exited: code ", exit.exit_code, ", signal ", exit.signal,
                  exit.reason.empty() ? "" : ", ", exit.reason);
    v1::RankReport report;
    report.mutable_exited()->set_exit_code(exit.exit_code);
    report.mutable_exited()->set_signal(exit.signal);
    report.mutable_exited()->set_reason(Shortened(exit.reason));
    report.mutable_exited()->set_worker_stopping(exit.worker_stopping);
    Report(ref, std::move(report));
  };

  absl::Status started = command.status();
  if (command.ok()) {
    // Held across Start so a fast exit cannot be delivered (and its rank erased) before the rank
    // is recorded. The callbacks never take this lock.
    std::lock_guard<std::mutex> lock(mu_);
    auto process = TrainerProcess::Start(*command, callbacks);
    started = process.status();
    if (process.ok()) ranks_[KeyOf(ref)] = Rank{ref, *std::move(process)};
  }
  if (!started.ok()) {
    util::LogError(Describe(ref), ": cannot start trainer: ", started.message());
    v1::RankReport report;
    report.mutable_exited()->set_exit_code(absl::IsInvalidArgument(started) ? hyscale::kExitBadInput
                                                                            : kExitCannotStart);
    report.mutable_exited()->set_reason(
        Shortened(absl::StrCat("cannot start trainer: ", started.message())));
    Report(ref, std::move(report));
    return;
  }
  util::LogInfo(Describe(ref), ": started ", options_.trainer_path, " (log ", command->log_path,
                ")");
}

void Agent::StopRank(const v1::RankRef& ref, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = ranks_.find(KeyOf(ref));
  if (found == ranks_.end() || !found->second.process) return;
  util::LogInfo(Describe(ref), ": stopping (",
                reason.empty() ? "stopped by the coordinator" : reason, ")");
  found->second.process->Stop(reason.empty() ? "stopped by the coordinator" : reason,
                              options_.stop_grace, TrainerProcess::StopCause::kCoordinator);
}

void Agent::StopAllTrainers() {
  std::vector<std::shared_ptr<TrainerProcess>> processes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, rank] : ranks_) {
      rank.process->Stop("worker shutting down", options_.stop_grace,
                         TrainerProcess::StopCause::kWorkerShutdown);
      processes.push_back(rank.process);
    }
  }
  for (const auto& process : processes) process->WaitForExit(options_.stop_grace + kReapSlack);
}

}  // namespace hyscale::agent
