// One trainer process (hyscale-train) for one rank: launched in its own process group, its stdout
// JSON lines read as events, its stdout and stderr kept as the rank's log, stopped as a group, and
// reaped with its exit code or signal.
#pragma once

#include <absl/status/statusor.h>
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hyscale/v1/service.pb.h"
#include "util/file.h"
#include "util/subprocess.h"
#include "worker/agent/job_paths.h"

namespace hyscale::agent {

// What to execute, fully resolved.
struct TrainerCommand {
  std::string program;                                   // absolute or relative path
  std::vector<std::string> args;                         // without argv[0]
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing in) ours
  std::string log_path;                                  // the rank's log file, appended to
  std::string pid_path;  // "<pid> <start time>" while the trainer runs: see EndLeftoverTrainers
  std::optional<util::RunAs> run_as;  // none: as the agent's user
};

// Where a rank's files go and what the worker knows about its devices.
struct RankSetup {
  std::string work_dir;
  std::string trainer_path;
  // The worker's device slots are GPUs: the trainer runs with --device cuda and
  // CUDA_VISIBLE_DEVICES set to its slot; else --device cpu.
  bool gpus = false;
  JobPaths paths;  // where the job may read data and write checkpoints
  std::optional<util::RunAs> run_as;
};

// Checks the job's data files and checkpoint folder against `setup.paths` (INVALID_ARGUMENT
// naming the field when one lies outside), writes `run.spec` with those paths resolved as
// <work_dir>/<job>/<attempt>/rank<N>/job.json (protobuf JSON with the proto's field names) and
// returns the command that trains it:
//   <trainer> --config job.json --checkpoint-dir <dir, resolved> [--resume]
// with HYSCALE_JOB_ID, HYSCALE_RANK, HYSCALE_ATTEMPT, HYSCALE_WORLD_SIZE, HYSCALE_RENDEZVOUS,
// HYSCALE_DEVICE_INDEX (and CUDA_VISIBLE_DEVICES for GPUs) set, and the log at
// <work_dir>/<job>/<attempt>/rank<N>.log (its pid file beside it, rank<N>.pid). Without a
// checkpoint_dir the spec's checkpoint.dir is used, and without that <work_dir>/<job>/checkpoints;
// the folder is created and, with `setup.run_as`, given to that user.
absl::StatusOr<TrainerCommand> PrepareRank(const v1::RunRank& run, const RankSetup& setup);

// Ends the trainers a previous agent on `work_dir` left running (it was killed before it could
// stop them): for each pid file, SIGKILL to the trainer's process group when its leader is the
// recorded process (same start time) or gone (what is left of the group), then the file goes.
// Returns the pids of the groups it killed.
std::vector<pid_t> EndLeftoverTrainers(const std::string& work_dir);

// How a trainer ended.
struct TrainerExit {
  int exit_code = 0;  // -1 when killed by a signal
  int signal = 0;
  std::string reason;  // the stop reason, the trainer's job_finished reason, or what happened
  // Stopped because its agent is shutting down (StopCause::kWorkerShutdown, or the process object
  // destroyed while it ran): no failure of the job's.
  bool worker_stopping = false;
};

class TrainerProcess {
 public:
  // Called in the order things happened: on_start from Start, the others from the process's
  // monitor thread.
  struct Callbacks {
    std::function<void(pid_t pid)> on_start;                     // before any other callback
    std::function<void(const std::string& json_line)> on_event;  // one stdout JSON event line
    std::function<void(const std::string& chunk)> on_log;        // stdout/stderr bytes
    std::function<void(const TrainerExit& exit)> on_exit;        // once, after reaping
  };

  // Forks and execs `command` in a new process group, as `command.run_as` when set, killed
  // (SIGKILL) when the agent dies. Fails (naming the program) when it cannot be executed;
  // callbacks only run for a process that started.
  static absl::StatusOr<std::unique_ptr<TrainerProcess>> Start(const TrainerCommand& command,
                                                               Callbacks callbacks);

  // Kills the process group if it still runs and waits for the monitor to finish.
  ~TrainerProcess();

  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  pid_t pid() const { return process_.pid(); }

  // Who asks a trainer to stop: the coordinator (the job was cancelled, failed elsewhere or
  // moved), or the agent itself on its way out (TrainerExit::worker_stopping).
  enum class StopCause { kCoordinator, kWorkerShutdown };

  // SIGTERM to the whole process group now, SIGKILL after `grace` if the trainer still runs.
  // `reason` becomes the exit's reason. Returns at once; repeated calls keep the first reason and
  // cause.
  void Stop(const std::string& reason, std::chrono::milliseconds grace, StopCause cause);

  // Waits up to `timeout` for the exit to be reported; true when it was.
  bool WaitForExit(std::chrono::milliseconds timeout);

 private:
  using Clock = std::chrono::steady_clock;

  TrainerProcess(util::Subprocess process, util::UniqueFd log, std::string pid_path,
                 Callbacks callbacks);
  void Monitor();
  // Splits stdout into lines: events go to on_event (and all bytes to the log).
  void HandleStdout(const char* data, size_t size);
  void HandleLine(const std::string& line);
  void WriteLog(const char* data, size_t size);
  TrainerExit DescribeExit(const util::ExitStatus& status);

  util::Subprocess process_;  // reaped by the monitor thread; signalled by any
  util::UniqueFd stdout_;     // monitor thread only
  util::UniqueFd stderr_;     // monitor thread only
  util::UniqueFd log_;        // monitor thread only
  const std::string pid_path_;
  const Callbacks callbacks_;
  std::string partial_line_;         // monitor thread only
  std::string job_finished_reason_;  // monitor thread only
  std::string stderr_tail_;          // monitor thread only: the last few KiB, for exit reasons

  std::mutex mu_;
  std::condition_variable exited_cv_;
  bool exited_ = false;
  std::optional<std::string> stop_reason_;
  StopCause stop_cause_ = StopCause::kCoordinator;  // of stop_reason_
  std::optional<Clock::time_point> kill_at_;
  bool killed_ = false;

  std::thread monitor_;
};

}  // namespace hyscale::agent
