#include "worker/agent/trainer_process.h"

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

extern char** environ;

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

absl::Status WriteFileAtomically(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat(temporary.string(), ": write failed"));
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) return absl::InternalError(absl::StrCat(path.string(), ": ", error.message()));
  return absl::OkStatus();
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

// Sets close-on-exec and non-blocking reads on a pipe end we keep.
void PrepareReadEnd(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
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
  if (auto status = WriteFileAtomically(config, json); !status.ok()) return status;

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
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the agent is multi-threaded).
  std::vector<std::string> argv_strings = {command.program};
  argv_strings.insert(argv_strings.end(), command.args.begin(), command.args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    bool replaced = false;
    for (const auto& [name, value] : command.env) {
      if (variable.compare(0, name.size() + 1, name + "=") == 0) replaced = true;
    }
    if (!replaced) env_strings.push_back(variable);
  }
  for (const auto& [name, value] : command.env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& variable : env_strings) envp.push_back(variable.data());
  envp.push_back(nullptr);

  const int log_fd =
      open(command.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(
        absl::StrCat(command.log_path, ": cannot open: ", std::strerror(errno)));
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (null_fd < 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
      pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int saved = errno;
    close(log_fd);
    return absl::InternalError(absl::StrCat("cannot create pipes: ", std::strerror(saved)));
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int saved = errno;
    for (int fd : {log_fd, null_fd, out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1],
                   exec_pipe[0], exec_pipe[1]}) {
      close(fd);
    }
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(saved)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // The agent's credentials, then the trainer's: dropping them clears the parent-death
    // signal, so that comes after.
    if (command.run_as && (setgroups(0, nullptr) != 0 || setgid(command.run_as->gid) != 0 ||
                           setuid(command.run_as->uid) != 0)) {
      const int error = errno;
      ssize_t ignored = write(exec_pipe[1], &error, sizeof error);
      (void)ignored;
      _exit(127);
    }
    // A trainer must not outlive its agent: a restarted agent would run the rank again beside it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // The agent blocks SIGTERM/SIGINT for its signal thread; the trainer must see them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) signal(sig, SIG_DFL);
    dup2(null_fd, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    const int error = errno;
    ssize_t ignored = write(exec_pipe[1], &error, sizeof error);
    (void)ignored;
    _exit(127);
  }
  // Also set in the parent so a Stop right after Start finds the group.
  setpgid(pid, pid);
  for (int fd : {null_fd, out_pipe[1], err_pipe[1], exec_pipe[1]}) close(fd);

  int exec_error = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &exec_error, sizeof exec_error);
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  if (n == sizeof exec_error) {
    waitpid(pid, nullptr, 0);
    for (int fd : {log_fd, out_pipe[0], err_pipe[0]}) close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(command.program, ": cannot execute",
                     command.run_as ? absl::StrCat(" as ", command.run_as->name) : "", ": ",
                     std::strerror(exec_error)));
  }
  PrepareReadEnd(out_pipe[0]);
  PrepareReadEnd(err_pipe[0]);
  // Best effort: without it only an agent killed between fork and prctl leaves a trainer behind.
  if (const auto started = StartTime(pid); started && !command.pid_path.empty()) {
    (void)WriteFileAtomically(command.pid_path, absl::StrCat(pid, " ", *started, "\n"));
  }
  if (callbacks.on_start) callbacks.on_start(pid);
  return std::unique_ptr<TrainerProcess>(new TrainerProcess(
      pid, out_pipe[0], err_pipe[0], log_fd, command.pid_path, std::move(callbacks)));
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

TrainerProcess::TrainerProcess(pid_t pid, int stdout_fd, int stderr_fd, int log_fd,
                               std::string pid_path, Callbacks callbacks)
    : pid_(pid),
      stdout_fd_(stdout_fd),
      stderr_fd_(stderr_fd),
      log_fd_(log_fd),
      pid_path_(std::move(pid_path)),
      callbacks_(std::move(callbacks)) {
  monitor_ = std::thread([this] { Monitor(); });
}

TrainerProcess::~TrainerProcess() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!exited_) {
      if (!stop_reason_) stop_reason_ = "agent shutting down";
      kill_at_ = Clock::now();
    }
  }
  monitor_.join();
}

void TrainerProcess::Stop(const std::string& reason, std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exited_ || stop_reason_) return;
  stop_reason_ = reason;
  kill_at_ = Clock::now() + grace;
  killpg(pid_, SIGTERM);
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
        killpg(pid_, SIGKILL);
        killed_ = true;
      }
    }
    if (!leader_exited) {
      // WNOWAIT leaves the zombie in place, so the group id cannot be reused while we kill
      // whatever the trainer left behind.
      siginfo_t info{};
      if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) {
        leader_exited = true;
        killpg(pid_, SIGKILL);
        drain_until = Clock::now() + kDrainAfterExit;
      }
    }
    const bool pipes_open = stdout_fd_ >= 0 || stderr_fd_ >= 0;
    if (leader_exited && (!pipes_open || Clock::now() >= drain_until)) break;

    pollfd fds[2];
    int count = 0;
    if (stdout_fd_ >= 0) fds[count++] = {stdout_fd_, POLLIN, 0};
    if (stderr_fd_ >= 0) fds[count++] = {stderr_fd_, POLLIN, 0};
    if (poll(fds, count, kPollMillis) <= 0) continue;
    for (int i = 0; i < count; ++i) {
      if (fds[i].revents == 0) continue;
      int* fd = fds[i].fd == stdout_fd_ ? &stdout_fd_ : &stderr_fd_;
      const ssize_t n = read(*fd, buffer, sizeof buffer);
      if (n > 0) {
        if (fd == &stdout_fd_) {
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
        close(*fd);
        *fd = -1;
      }
    }
  }
  for (int* fd : {&stdout_fd_, &stderr_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  if (!partial_line_.empty()) HandleLine(partial_line_);
  partial_line_.clear();

  int wait_status = 0;
  while (waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (!pid_path_.empty()) unlink(pid_path_.c_str());
  close(log_fd_);
  const TrainerExit exit = DescribeExit(wait_status);
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
    const ssize_t n = write(log_fd_, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk must not stop the trainer's events
    data += n;
    size -= static_cast<size_t>(n);
  }
}

TrainerExit TrainerProcess::DescribeExit(int wait_status) {
  TrainerExit exit;
  if (WIFSIGNALED(wait_status)) {
    exit.exit_code = -1;
    exit.signal = WTERMSIG(wait_status);
  } else {
    exit.exit_code = WEXITSTATUS(wait_status);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_reason_) {
    exit.reason = *stop_reason_;
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
