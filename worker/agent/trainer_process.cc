#include "worker/agent/trainer_process.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "proto/constants.h"
#include "proto/events.h"
#include "util/file.h"

namespace hyscale::agent {
namespace {

namespace fs = std::filesystem;

// How long to keep reading a dead trainer's pipes that a leftover child still holds.
constexpr std::chrono::seconds kDrainAfterExit{2};
constexpr int kPollMillis = 100;
// Stderr kept to explain a failed exit (its last line, at most kReasonLine long).
constexpr size_t kStderrTail = 4096;
constexpr size_t kReasonLine = 300;

// The last non-empty line of `text`, shortened to kReasonLine.
std::string LastLine(const std::string& text) {
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t newline = text.rfind('\n', end);
  const size_t start = newline == std::string::npos ? 0 : newline + 1;
  std::string line = text.substr(start, end - start + 1);
  if (line.size() > kReasonLine) line = line.substr(0, kReasonLine) + "...";
  return line;
}

bool SafePathComponent(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. Pids are
// reused; a pid and its start time are not.
std::optional<uint64_t> StartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the command name may hold spaces and parens
  if (name_end == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    uint64_t value = 0;
    if (i == 22 && absl::SimpleAtoi(field, &value)) return value;
  }
  return std::nullopt;
}

// Non-blocking reads on a pipe end we keep.
void PrepareReadEnd(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// How `command` runs: in its own process group, killed (SIGKILL) when the agent dies (a
// restarted agent would run the rank again beside it), stdout and stderr on pipes for the agent
// to read.
util::Command ChildCommand(const TrainerCommand& command) {
  std::vector<std::string> argv = {command.program};
  argv.insert(argv.end(), command.args.begin(), command.args.end());
  util::Command child(std::move(argv));
  child.env = command.env;
  child.stdout_to = util::Redirect::Pipe();
  child.stderr_to = util::Redirect::Pipe();
  child.new_process_group = true;
  child.parent_death_signal = SIGKILL;
  child.run_as = command.run_as;
  return child;
}

}  // namespace

absl::StatusOr<TrainerCommand> PrepareRank(const v1::RunRank& run, const RankSetup& setup) {
  const v1::RankRef& ref = run.ref();
  if (!SafePathComponent(ref.job_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("run.ref.job_id: not a usable directory name (got '", ref.job_id(), "')"));
  }
  if (ref.rank() < 0 || ref.attempt() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("run.ref: negative rank or attempt (got rank ",
                                                   ref.rank(), ", attempt ", ref.attempt(), ")"));
  }
  // The job's files, resolved: the trainer opens exactly what was checked.
  v1::JobSpec spec = run.spec();
  v1::DataSpec* data = spec.mutable_data();
  if (data->has_token_file()) {
    auto path = setup.paths.Readable("spec.data.token_file.path", data->token_file().path());
    if (!path.ok()) return path.status();
    data->mutable_token_file()->set_path(*path);
  }
  if (data->has_text_file()) {
    auto path = setup.paths.Readable("spec.data.text_file.path", data->text_file().path());
    if (!path.ok()) return path.status();
    data->mutable_text_file()->set_path(*path);
  }
  // The coordinator's directory, else the spec's own, else one in the work dir.
  std::string checkpoint_field = "run.checkpoint_dir";
  std::string checkpoint_dir = run.checkpoint_dir();
  if (checkpoint_dir.empty() && !spec.checkpoint().dir().empty()) {
    checkpoint_field = "spec.checkpoint.dir";
    checkpoint_dir = spec.checkpoint().dir();
  } else if (checkpoint_dir.empty()) {
    checkpoint_dir = (fs::path(setup.work_dir) / ref.job_id() / "checkpoints").string();
  }
  auto checked_checkpoint_dir = setup.paths.Writable(checkpoint_field, checkpoint_dir);
  if (!checked_checkpoint_dir.ok()) return checked_checkpoint_dir.status();
  checkpoint_dir = *checked_checkpoint_dir;

  const fs::path attempt_dir =
      fs::path(setup.work_dir) / ref.job_id() / std::to_string(ref.attempt());
  const fs::path rank_dir = attempt_dir / absl::StrCat("rank", ref.rank());
  std::error_code error;
  for (const fs::path& dir : {rank_dir, fs::path(checkpoint_dir)}) {
    fs::create_directories(dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat(dir.string(), ": cannot create: ", error.message()));
    }
  }
  if (setup.run_as && chown(checkpoint_dir.c_str(), setup.run_as->uid, setup.run_as->gid) != 0) {
    return absl::InternalError(absl::StrCat(checkpoint_dir, ": cannot give it to ",
                                            setup.run_as->name, ": ", std::strerror(errno)));
  }

  google::protobuf::util::JsonPrintOptions json_options;
  json_options.preserve_proto_field_names = true;
  json_options.add_whitespace = true;
  std::string json;
  if (auto status = google::protobuf::util::MessageToJsonString(spec, &json, json_options);
      !status.ok()) {
    return absl::InternalError(absl::StrCat("run.spec: cannot write as JSON: ", status.ToString()));
  }
  const fs::path config = rank_dir / "job.json";
  if (auto status = util::WriteFileAtomically(config.string(), json); !status.ok()) {
    // The worker's disk, not the job: never INVALID_ARGUMENT, which is reported as bad input.
    return absl::InternalError(status.message());
  }

  TrainerCommand command;
  command.program = setup.trainer_path;
  command.args = {"--config", config.string()};
  command.args.insert(command.args.end(), {"--checkpoint-dir", checkpoint_dir});
  if (run.resume()) command.args.push_back("--resume");
  // The slot's kind, not what the trainer finds: a CPU slot on a machine with GPUs trains on CPU.
  command.args.insert(command.args.end(), {"--device", setup.gpus ? "cuda" : "cpu"});
  command.env = {{"HYSCALE_JOB_ID", ref.job_id()},
                 {"HYSCALE_RANK", std::to_string(ref.rank())},
                 {"HYSCALE_ATTEMPT", std::to_string(ref.attempt())},
                 {"HYSCALE_WORLD_SIZE", std::to_string(std::max(1, run.world_size()))},
                 {"HYSCALE_RENDEZVOUS", run.rendezvous()},
                 {"HYSCALE_DEVICE_INDEX", std::to_string(run.device_index())}};
  if (setup.gpus)
    command.env.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(run.device_index()));
  command.log_path = (attempt_dir / absl::StrCat("rank", ref.rank(), ".log")).string();
  command.pid_path = (attempt_dir / absl::StrCat("rank", ref.rank(), ".pid")).string();
  command.run_as = setup.run_as;
  return command;
}

absl::StatusOr<std::unique_ptr<TrainerProcess>> TrainerProcess::Start(const TrainerCommand& command,
                                                                      Callbacks callbacks) {
  util::UniqueFd log(
      open(command.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!log.valid()) {
    return absl::InternalError(
        absl::StrCat(command.log_path, ": cannot open: ", std::strerror(errno)));
  }
  auto process = util::Subprocess::Start(ChildCommand(command));
  if (!process.ok()) return process.status();
  const pid_t pid = process->pid();
  // Best effort: without it only an agent killed between fork and prctl leaves a trainer behind.
  if (const auto started = StartTime(pid); started && !command.pid_path.empty()) {
    (void)util::WriteFileAtomically(command.pid_path, absl::StrCat(pid, " ", *started, "\n"));
  }
  if (callbacks.on_start) callbacks.on_start(pid);
  return std::unique_ptr<TrainerProcess>(new TrainerProcess(
      *std::move(process), std::move(log), command.pid_path, std::move(callbacks)));
}

std::vector<pid_t> EndLeftoverTrainers(const std::string& work_dir) {
  std::vector<pid_t> killed;
  std::error_code error;
  // <work_dir>/<job>/<attempt>/rank<N>.pid
  for (fs::recursive_directory_iterator it(work_dir, error), end; !error && it != end;
       it.increment(error)) {
    if (it.depth() >= 2) it.disable_recursion_pending();
    const fs::path& path = it->path();
    // Only the agent's own files: trainers may write checkpoints under <job>/, not <attempt>/.
    const std::string attempt = path.parent_path().filename().string();
    const std::string name = path.filename().string();
    if (it.depth() != 2 || attempt.empty() ||
        !std::all_of(attempt.begin(), attempt.end(), ::isdigit) ||
        !absl::StartsWith(name, "rank") || !absl::EndsWith(name, ".pid")) {
      continue;
    }
    std::ifstream in(path);
    pid_t pid = 0;
    uint64_t recorded = 0;
    if (in >> pid >> recorded && pid > 1) {
      const std::optional<uint64_t> started = StartTime(pid);
      // A live leader with another start time is an unrelated process that got the pid.
      if ((!started || *started == recorded) && killpg(pid, SIGKILL) == 0) killed.push_back(pid);
    }
    fs::remove(path, error);
    error.clear();
  }
  return killed;
}

TrainerProcess::TrainerProcess(util::Subprocess process, util::UniqueFd log, std::string pid_path,
                               Callbacks callbacks)
    : process_(std::move(process)),
      stdout_(process_.TakeStdout()),
      stderr_(process_.TakeStderr()),
      log_(std::move(log)),
      pid_path_(std::move(pid_path)),
      callbacks_(std::move(callbacks)) {
  PrepareReadEnd(stdout_.get());
  PrepareReadEnd(stderr_.get());
  monitor_ = std::thread([this] { Monitor(); });
}

TrainerProcess::~TrainerProcess() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!exited_) {
      if (!stop_reason_) {
        stop_reason_ = "agent shutting down";
        stop_cause_ = StopCause::kWorkerShutdown;
      }
      kill_at_ = Clock::now();
    }
  }
  monitor_.join();
}

void TrainerProcess::Stop(const std::string& reason, std::chrono::milliseconds grace,
                          StopCause cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exited_ || stop_reason_) return;
  stop_reason_ = reason;
  stop_cause_ = cause;
  kill_at_ = Clock::now() + grace;
  process_.SignalGroup(SIGTERM);
}

bool TrainerProcess::WaitForExit(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return exited_cv_.wait_for(lock, timeout, [this] { return exited_; });
}

void TrainerProcess::Monitor() {
  bool leader_exited = false;
  Clock::time_point drain_until{};
  char buffer[64 * 1024];
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (kill_at_ && !killed_ && Clock::now() >= *kill_at_) {
        process_.SignalGroup(SIGKILL);
        killed_ = true;
      }
    }
    // The leader stays unreaped (a zombie) until the end, so the group id cannot be reused while
    // we kill whatever the trainer left behind.
    if (!leader_exited && process_.HasExited()) {
      leader_exited = true;
      process_.SignalGroup(SIGKILL);
      drain_until = Clock::now() + kDrainAfterExit;
    }
    const bool pipes_open = stdout_.valid() || stderr_.valid();
    if (leader_exited && (!pipes_open || Clock::now() >= drain_until)) break;

    pollfd fds[2];
    int count = 0;
    if (stdout_.valid()) fds[count++] = {stdout_.get(), POLLIN, 0};
    if (stderr_.valid()) fds[count++] = {stderr_.get(), POLLIN, 0};
    if (poll(fds, count, kPollMillis) <= 0) continue;
    for (int i = 0; i < count; ++i) {
      if (fds[i].revents == 0) continue;
      util::UniqueFd& fd = fds[i].fd == stdout_.get() ? stdout_ : stderr_;
      const ssize_t n = read(fd.get(), buffer, sizeof buffer);
      if (n > 0) {
        if (&fd == &stdout_) {
          HandleStdout(buffer, static_cast<size_t>(n));
        } else {
          stderr_tail_.append(buffer, static_cast<size_t>(n));
          if (stderr_tail_.size() > kStderrTail) {
            stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
          }
          WriteLog(buffer, static_cast<size_t>(n));
          if (callbacks_.on_log) callbacks_.on_log(std::string(buffer, static_cast<size_t>(n)));
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        fd.Reset();
      }
    }
  }
  stdout_.Reset();
  stderr_.Reset();
  if (!partial_line_.empty()) HandleLine(partial_line_);
  partial_line_.clear();

  const util::ExitStatus status = process_.Wait();
  if (!pid_path_.empty()) unlink(pid_path_.c_str());
  log_.Reset();
  const TrainerExit exit = DescribeExit(status);
  if (callbacks_.on_exit) callbacks_.on_exit(exit);
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
  }
  exited_cv_.notify_all();
}

void TrainerProcess::HandleStdout(const char* data, size_t size) {
  WriteLog(data, size);
  if (callbacks_.on_log) callbacks_.on_log(std::string(data, size));
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '\n') continue;
    partial_line_.append(data + start, i - start);
    HandleLine(partial_line_);
    partial_line_.clear();
    start = i + 1;
  }
  partial_line_.append(data + start, size - start);
  if (partial_line_.size() > kMaxEventLineBytes) partial_line_.clear();
}

void TrainerProcess::HandleLine(const std::string& raw) {
  std::string line = raw;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty() || line.front() != '{' || line.size() > kMaxEventLineBytes) return;
  // A line that is not an event only goes to the log.
  const auto event = ParseEventLine(line);
  if (!event.ok()) return;
  if (event->has_job_finished()) job_finished_reason_ = event->job_finished().reason();
  if (callbacks_.on_event) callbacks_.on_event(line);
}

void TrainerProcess::WriteLog(const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(log_.get(), data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk must not stop the trainer's events
    data += n;
    size -= static_cast<size_t>(n);
  }
}

TrainerExit TrainerProcess::DescribeExit(const util::ExitStatus& status) {
  TrainerExit exit;
  exit.exit_code = status.exit_code;
  exit.signal = status.signal;
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_reason_) {
    exit.reason = *stop_reason_;
    exit.worker_stopping = stop_cause_ == StopCause::kWorkerShutdown;
  } else if (!job_finished_reason_.empty()) {
    exit.reason = job_finished_reason_;
  } else if (exit.signal != 0) {
    exit.reason = absl::StrCat("killed by signal ", exit.signal, " (", strsignal(exit.signal), ")");
  } else if (exit.exit_code != 0) {
    exit.reason = absl::StrCat("exited with code ", exit.exit_code);
    if (const std::string line = LastLine(stderr_tail_); !line.empty()) {
      absl::StrAppend(&exit.reason, ": ", line);
    }
  }
  return exit;
}

}  // namespace hyscale::agent
