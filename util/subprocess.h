// Child processes: started with fork and execve from a multi-threaded parent (everything the
// child needs is built before the fork; between fork and exec only async-signal-safe calls), with
// their standard streams, environment, process group, parent-death signal and user chosen by the
// caller; signalled, waited for with timeouts, stopped with SIGTERM then SIGKILL, and reaped.
#pragma once

#include <absl/status/statusor.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/file.h"

namespace hyscale::util {

// An unprivileged user a child runs as (the parent runs as root).
struct RunAs {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Where one of the child's output streams goes. Its input is always /dev/null.
class Redirect {
 public:
  enum class Kind { kInherit, kNull, kPipe, kAppend, kTruncate, kToStdout };

  static Redirect Inherit() { return Redirect(Kind::kInherit); }  // the parent's
  static Redirect Null() { return Redirect(Kind::kNull); }
  // A pipe the parent reads: Subprocess::TakeStdout / TakeStderr.
  static Redirect Pipe() { return Redirect(Kind::kPipe); }
  static Redirect AppendTo(std::string path) { return Redirect(Kind::kAppend, std::move(path)); }
  static Redirect WriteTo(std::string path) { return Redirect(Kind::kTruncate, std::move(path)); }
  // For stderr: wherever stdout goes (2>&1).
  static Redirect ToStdout() { return Redirect(Kind::kToStdout); }

  Kind kind() const { return kind_; }
  const std::string& path() const { return path_; }

 private:
  explicit Redirect(Kind kind, std::string path = "") : kind_(kind), path_(std::move(path)) {}

  Kind kind_;
  std::string path_;
};

// What to run and how. The defaults give a plain child: our environment, our output, our process
// group, unaffected by our death.
struct Command {
  Command() = default;
  explicit Command(std::vector<std::string> program_and_args) : argv(std::move(program_and_args)) {}

  std::vector<std::string> argv;                         // argv[0]: the program's path
  std::vector<std::pair<std::string, std::string>> env;  // added to ours, replacing the same name
  std::vector<std::string> unset_env;                    // removed from ours
  Redirect stdout_to = Redirect::Inherit();
  Redirect stderr_to = Redirect::Inherit();
  // Its own process group (pgid = pid): Ctrl-C at our terminal does not reach it, and
  // Subprocess::SignalGroup reaches whatever it starts.
  bool new_process_group = false;
  // Sent to the child when we die (checked after the user switch, which would clear it).
  std::optional<int> parent_death_signal;
  std::optional<RunAs> run_as;  // none: as our user
};

// How a process ended.
struct ExitStatus {
  int exit_code = 0;  // -1 when a signal ended it
  int signal = 0;     // the signal that ended it, else 0

  static ExitStatus FromWaitStatus(int wait_status);
  // As a shell reports it: the exit code, or 128 + the signal.
  int ShellCode() const { return signal != 0 ? 128 + signal : exit_code; }
  bool Succeeded() const { return signal == 0 && exit_code == 0; }
};

// One started child. Not thread-safe, except that Signal and SignalGroup may run beside Wait in
// another thread. Destroying it kills (SIGKILL, its group too when it leads one) and reaps a child
// not reaped yet.
class Subprocess {
 public:
  // Starts `command`. The child's signal mask is cleared and SIGPIPE, SIGTERM, SIGINT and SIGHUP
  // are back to their defaults (we may block or ignore them). FAILED_PRECONDITION, naming the
  // program (and the user), when it cannot be executed, e.g. missing or not permitted.
  static absl::StatusOr<Subprocess> Start(const Command& command);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // The read ends of Redirect::Pipe() streams (invalid for other kinds, or once taken).
  UniqueFd TakeStdout() { return std::move(stdout_); }
  UniqueFd TakeStderr() { return std::move(stderr_); }

  // To the process / to its process group (started with new_process_group). Only until it is
  // reaped: its pid may be reused after.
  void Signal(int signal) const;
  void SignalGroup(int signal) const;

  // Whether it has exited, leaving it unreaped: its pid and group id stay taken until Wait.
  bool HasExited() const;
  // Its exit once it has exited (reaped), else nothing at once.
  std::optional<ExitStatus> TryWait();
  // Its exit, waiting as long as it takes.
  ExitStatus Wait();
  // Its exit, waiting up to `timeout`.
  std::optional<ExitStatus> WaitFor(std::chrono::milliseconds timeout);
  // SIGTERM (to the process), then SIGKILL if it still runs after `grace`; its exit.
  ExitStatus Stop(std::chrono::milliseconds grace);

 private:
  Subprocess(pid_t pid, bool group_leader, UniqueFd stdout_read, UniqueFd stderr_read)
      : pid_(pid),
        group_leader_(group_leader),
        stdout_(std::move(stdout_read)),
        stderr_(std::move(stderr_read)) {}
  void KillAndReap();

  pid_t pid_ = -1;  // -1 once moved from
  bool group_leader_ = false;
  UniqueFd stdout_;
  UniqueFd stderr_;
  std::optional<ExitStatus> exit_;  // once reaped
};

// What RunAndCapture saw.
struct CommandOutput {
  ExitStatus exit;
  std::string output;      // what it wrote to stdout (and stderr, with Redirect::ToStdout)
  bool timed_out = false;  // killed (SIGKILL, its group too) at the timeout
};

// Runs `command` to its end with its stdout on a pipe (command.stdout_to is ignored) and returns
// what it wrote; with a `timeout`, a child still running (or whose pipe is held open) then is
// killed.
absl::StatusOr<CommandOutput> RunAndCapture(
    Command command, std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// Runs `body` in a forked child and returns the code it returns, as the child's exit code. `body`
// may only make async-signal-safe calls (the parent may have threads).
absl::StatusOr<int> RunInChild(const std::function<int()>& body);

// Takes `user`'s ids (no supplementary groups). Async-signal-safe; 0, else the errno.
int SwitchUser(const RunAs& user);

// `name` when it holds a '/', else the first executable `name` in a folder of $PATH; empty when
// there is none.
std::string FindExecutable(const std::string& name);

}  // namespace hyscale::util
