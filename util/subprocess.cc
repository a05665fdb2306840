#include "util/subprocess.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace hyscale::util {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kWaitPoll{20};

// INTERNAL, with errno's text: the machine's trouble, never the caller's input.
absl::Status SystemError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// NULL-terminated pointers into `strings`, for execve.
std::vector<char*> PointersTo(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Our environment without the names `command` sets or unsets, then the ones it sets.
std::vector<std::string> ChildEnvironment(const Command& command) {
  const auto named = [](const std::string& variable, const std::string& name) {
    return variable.size() > name.size() && variable.compare(0, name.size(), name) == 0 &&
           variable[name.size()] == '=';
  };
  std::vector<std::string> variables;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    bool dropped = false;
    for (const auto& [name, value] : command.env) dropped = dropped || named(variable, name);
    for (const auto& name : command.unset_env) dropped = dropped || named(variable, name);
    if (!dropped) variables.push_back(variable);
  }
  for (const auto& [name, value] : command.env) variables.push_back(absl::StrCat(name, "=", value));
  return variables;
}

// One output stream's file descriptors: what the child gets (`child`, -1: leave it) and what
// the parent keeps (`parent`, a pipe's read end).
struct StreamFds {
  UniqueFd child;
  UniqueFd parent;
  bool to_stdout = false;
};

absl::StatusOr<StreamFds> OpenStream(const Redirect& redirect) {
  StreamFds fds;
  const auto open_file = [&fds](const std::string& path, int flags) -> absl::Status {
    fds.child = UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0644));
    if (!fds.child.valid()) return SystemError(absl::StrCat(path, ": cannot open"));
    return absl::OkStatus();
  };
  switch (redirect.kind()) {
    case Redirect::Kind::kInherit:
      break;
    case Redirect::Kind::kToStdout:
      fds.to_stdout = true;
      break;
    case Redirect::Kind::kNull:
      if (auto status = open_file("/dev/null", 0); !status.ok()) return status;
      break;
    case Redirect::Kind::kAppend:
      if (auto status = open_file(redirect.path(), O_APPEND); !status.ok()) return status;
      break;
    case Redirect::Kind::kTruncate:
      if (auto status = open_file(redirect.path(), O_TRUNC); !status.ok()) return status;
      break;
    case Redirect::Kind::kPipe: {
      int ends[2];
      if (::pipe2(ends, O_CLOEXEC) != 0) return SystemError("cannot create a pipe");
      fds.parent = UniqueFd(ends[0]);
      fds.child = UniqueFd(ends[1]);
      break;
    }
  }
  return fds;
}

// Tells the parent why the child could not exec, then ends the child.
[[noreturn]] void FailInChild(int report_fd, int error) {
  const ssize_t ignored = ::write(report_fd, &error, sizeof error);
  (void)ignored;
  ::_exit(127);
}

// What the child's side needs, all of it made before the fork.
struct ChildSetup {
  const Command& command;
  pid_t parent;
  int stdin_fd;
  int stdout_fd;  // -1: as inherited
  int stderr_fd;  // -1: as inherited, or stdout's with stderr_to_stdout
  bool stderr_to_stdout;
  char* const* argv;
  char* const* envp;
  int report_fd;  // where an exec error goes
};

// The child's side, between fork and exec: async-signal-safe calls only.
[[noreturn]] void ExecInChild(const ChildSetup& setup) {
  const Command& command = setup.command;
  if (command.new_process_group) ::setpgid(0, 0);
  if (command.run_as) {
    if (const int error = SwitchUser(*command.run_as); error != 0) {
      FailInChild(setup.report_fd, error);
    }
  }
  // After the user switch, which clears it.
  if (command.parent_death_signal) {
    ::prctl(PR_SET_PDEATHSIG, *command.parent_death_signal);
    // The parent may have died before the prctl: then nobody would send the signal.
    if (::getppid() != setup.parent) ::_exit(127);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) ::signal(sig, SIG_DFL);
  ::dup2(setup.stdin_fd, STDIN_FILENO);
  if (setup.stdout_fd >= 0) ::dup2(setup.stdout_fd, STDOUT_FILENO);
  if (setup.stderr_to_stdout) {
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
  } else if (setup.stderr_fd >= 0) {
    ::dup2(setup.stderr_fd, STDERR_FILENO);
  }
  ::execve(setup.argv[0], setup.argv, setup.envp);
  FailInChild(setup.report_fd, errno);
}

}  // namespace

ExitStatus ExitStatus::FromWaitStatus(int wait_status) {
  if (WIFSIGNALED(wait_status)) return {-1, WTERMSIG(wait_status)};
  return {WEXITSTATUS(wait_status), 0};
}

absl::StatusOr<Subprocess> Subprocess::Start(const Command& command) {
  if (command.argv.empty()) return absl::InvalidArgumentError("command: no program");
  std::vector<std::string> argv_strings = command.argv;
  std::vector<std::string> env_strings = ChildEnvironment(command);
  const std::vector<char*> argv = PointersTo(argv_strings);
  const std::vector<char*> envp = PointersTo(env_strings);

  const UniqueFd stdin_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!stdin_fd.valid()) return SystemError("/dev/null: cannot open");
  auto out = OpenStream(command.stdout_to);
  if (!out.ok()) return out.status();
  auto err = OpenStream(command.stderr_to);
  if (!err.ok()) return err.status();
  int report[2];  // the child's exec error; closed by a successful exec
  if (::pipe2(report, O_CLOEXEC) != 0) return SystemError("cannot create a pipe");
  UniqueFd report_read(report[0]);
  UniqueFd report_write(report[1]);

  const ChildSetup setup{command,          ::getpid(),       stdin_fd.get(),
                         out->child.get(), err->child.get(), err->to_stdout,
                         argv.data(),      envp.data(),      report_write.get()};
  const pid_t pid = ::fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) ExecInChild(setup);
  // Also in the parent, so that a SignalGroup right after Start finds the group.
  if (command.new_process_group) ::setpgid(pid, pid);
  report_write.Reset();
  out->child.Reset();
  err->child.Reset();
  Subprocess process(pid, command.new_process_group, std::move(out->parent),
                     std::move(err->parent));

  int exec_error = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &exec_error, sizeof exec_error);
  } while (n < 0 && errno == EINTR);
  if (n == sizeof exec_error) {
    process.Wait();
    return absl::FailedPreconditionError(
        absl::StrCat(command.argv[0], ": cannot execute",
                     command.run_as ? absl::StrCat(" as ", command.run_as->name) : "", ": ",
                     std::strerror(exec_error)));
  }
  return process;
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      group_leader_(other.group_leader_),
      stdout_(std::move(other.stdout_)),
      stderr_(std::move(other.stderr_)),
      exit_(other.exit_) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    pid_ = std::exchange(other.pid_, -1);
    group_leader_ = other.group_leader_;
    stdout_ = std::move(other.stdout_);
    stderr_ = std::move(other.stderr_);
    exit_ = other.exit_;
  }
  return *this;
}

Subprocess::~Subprocess() {
  KillAndReap();
}

void Subprocess::KillAndReap() {
  if (pid_ < 0 || exit_) return;
  if (group_leader_) SignalGroup(SIGKILL);
  Signal(SIGKILL);
  Wait();
}

// A moved-from process has pid -1, and kill(-1, ...) would signal every process we may signal.
void Subprocess::Signal(int signal) const {
  if (pid_ > 0) ::kill(pid_, signal);
}

void Subprocess::SignalGroup(int signal) const {
  if (pid_ > 0) ::killpg(pid_, signal);
}

bool Subprocess::HasExited() const {
  if (exit_) return true;
  siginfo_t info{};
  return ::waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
}

std::optional<ExitStatus> Subprocess::TryWait() {
  if (exit_) return exit_;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) exit_ = ExitStatus::FromWaitStatus(status);
  return exit_;
}

ExitStatus Subprocess::Wait() {
  if (exit_) return *exit_;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_ = ExitStatus::FromWaitStatus(status);
  return *exit_;
}

std::optional<ExitStatus> Subprocess::WaitFor(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (auto exit = TryWait()) return exit;
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(kWaitPoll);
  }
}

ExitStatus Subprocess::Stop(std::chrono::milliseconds grace) {
  if (exit_) return *exit_;
  Signal(SIGTERM);
  if (auto exit = WaitFor(grace)) return *exit;
  Signal(SIGKILL);
  return Wait();
}

absl::StatusOr<CommandOutput> RunAndCapture(Command command,
                                            std::optional<std::chrono::milliseconds> timeout) {
  command.stdout_to = Redirect::Pipe();
  auto process = Subprocess::Start(command);
  if (!process.ok()) return process.status();
  const UniqueFd pipe = process->TakeStdout();
  const std::optional<Clock::time_point> deadline =
      timeout ? std::optional(Clock::now() + *timeout) : std::nullopt;
  CommandOutput result;
  char buffer[4096];
  while (true) {
    int wait_ms = -1;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
      if (left.count() <= 0) {
        result.timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(left.count());
    }
    pollfd fd{pipe.get(), POLLIN, 0};
    const int ready = ::poll(&fd, 1, wait_ms);
    if (ready < 0 && errno != EINTR) return SystemError("poll");
    if (ready <= 0) continue;
    const ssize_t n = ::read(pipe.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  if (result.timed_out) {
    if (command.new_process_group) process->SignalGroup(SIGKILL);
    process->Signal(SIGKILL);
  }
  result.exit = process->Wait();
  return result;
}

absl::StatusOr<int> RunInChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) ::_exit(body());
  int status = 0;
  pid_t waited;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited != pid) return SystemError("waitpid");
  const ExitStatus exit = ExitStatus::FromWaitStatus(status);
  if (exit.signal != 0) {
    return absl::InternalError(absl::StrCat("child killed by signal ", exit.signal));
  }
  return exit.exit_code;
}

int SwitchUser(const RunAs& user) {
  if (::setgroups(0, nullptr) != 0 || ::setgid(user.gid) != 0 || ::setuid(user.uid) != 0) {
    return errno;
  }
  return 0;
}

std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view folder : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(folder, "/", name);
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

}  // namespace hyscale::util
