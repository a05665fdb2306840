// hyscale-worker: the worker agent. Registers this machine's devices with the coordinator
// (hyscaled), runs the ranks it assigns as hyscale-train processes and reports their progress.
// SIGTERM or SIGINT stops the trainers and exits.
//
// Exit codes: 0 after a signal-initiated shutdown; 2 bad flags; 1 setup failed.
#include <absl/strings/str_cat.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>
#include <thread>

#include "proto/constants.h"
#include "proto/rpc.h"
#include "util/log.h"
#include "util/subprocess.h"
#include "worker/agent/agent.h"
#include "worker/agent/devices.h"

namespace {

namespace fs = std::filesystem;

using hyscale::kExitBadInput;
using hyscale::kExitFailed;
using hyscale::kExitOk;

std::string Hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool IsExecutable(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error) && access(path.c_str(), X_OK) == 0;
}

// hyscale-train next to this binary (installed layout), else ../trainer/hyscale-train (build
// layout: worker/agent and worker/trainer), else on PATH. Empty when none is found.
std::string FindTrainer() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    for (const fs::path& candidate : {self.parent_path() / "hyscale-train",
                                      self.parent_path() / ".." / "trainer" / "hyscale-train"}) {
      if (IsExecutable(candidate)) return fs::weakly_canonical(candidate, error).string();
    }
  }
  return hyscale::util::FindExecutable("hyscale-train");
}

// The user trainers run as: `name` (default nobody when the agent runs as root, else the agent's
// own user). Running as the agent's own user switches nothing.
absl::StatusOr<std::optional<hyscale::util::RunAs>> ResolveRunAs(std::string name) {
  const bool root = geteuid() == 0;
  if (name.empty()) {
    if (!root) return std::nullopt;
    name = "nobody";
  }
  const passwd* user = getpwnam(name.c_str());
  if (user == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--run-as: no user '", name, "'"));
  }
  if (user->pw_uid == geteuid()) return std::nullopt;
  if (!root) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run-as: starting trainers as '", name, "' needs root"));
  }
  return hyscale::util::RunAs{name, user->pw_uid, user->pw_gid};
}

// Whether `user` can execute the trainer and enter the work dir (each rank's job.json is there),
// checked in a child that takes the user's ids: without this every rank would fail to start,
// one restart after another.
absl::Status CheckRunAs(const hyscale::util::RunAs& user, const std::string& trainer,
                        const std::string& work_dir) {
  constexpr int kCannotSwitch = 2, kCannotExecute = 3, kCannotEnter = 4;
  const auto checked = hyscale::util::RunInChild([&] {
    if (hyscale::util::SwitchUser(user) != 0) return kCannotSwitch;
    if (access(trainer.c_str(), X_OK) != 0) return kCannotExecute;
    return access(work_dir.c_str(), X_OK) != 0 ? kCannotEnter : 0;
  });
  if (!checked.ok()) return absl::InternalError("--run-as: cannot check the user's access");
  switch (*checked) {
    case 0:
      return absl::OkStatus();
    case kCannotExecute:
      return absl::FailedPreconditionError(
          absl::StrCat("--run-as: ", user.name, " cannot execute the trainer ", trainer,
                       " (it, and every folder above it, must be open to that user)"));
    case kCannotEnter:
      return absl::FailedPreconditionError(
          absl::StrCat("--run-as: ", user.name, " cannot enter the work dir ", work_dir,
                       " (it, and every folder above it, must be searchable by that user)"));
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("--run-as: cannot take the ids of ", user.name));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hyscale-worker: runs HyScale trainer processes for the coordinator"};
  std::string server, token, token_file, tls_ca, name = Hostname(), address, devices_text,
                                                 work_dir = "./hyscale-worker", trainer, run_as,
                                                 log_level = "info";
  std::vector<std::string> data_roots, checkpoint_roots;
  int64_t heartbeat_ms = 2000, stop_grace_ms = 10000, timeout_ms = 10000;
  app.add_option("--server", server, "Coordinator host:port (env HYSCALE_SERVER)")
      ->envname("HYSCALE_SERVER")
      ->default_str("127.0.0.1:50051");
  app.add_option("--token", token, "Bearer token (else --token-file, else env HYSCALE_TOKEN)");
  app.add_option("--token-file", token_file, "File holding the bearer token");
  app.add_option("--tls-ca", tls_ca, "PEM CA certificates: connect with TLS");
  app.add_option("--name", name, "Worker name, the worker id (default: hostname)");
  app.add_option("--address", address, "Host other ranks reach this one at (default: --name)");
  app.add_option("--devices", devices_text,
                 "Device override, e.g. cpu:2 or gpu:8:141GB (default: detect)");
  app.add_option("--work-dir", work_dir, "Directory for job specs and rank logs")
      ->capture_default_str();
  app.add_option("--data-root", data_roots,
                 "Folder jobs may read data files from (repeatable; default <work-dir>/data)");
  app.add_option("--checkpoint-root", checkpoint_roots,
                 "Folder jobs may write checkpoints under (repeatable; default <work-dir>); the "
                 "coordinator's --checkpoint-root must lie in one");
  app.add_option("--run-as", run_as,
                 "User the trainers run as (default: nobody when run as root, else this user)");
  app.add_option("--trainer", trainer,
                 "hyscale-train binary (default: next to hyscale-worker, ../trainer, or PATH)");
  app.add_option("--heartbeat-interval-ms", heartbeat_ms,
                 "Heartbeat period until the coordinator sets one")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--stop-grace-ms", stop_grace_ms, "SIGTERM to SIGKILL grace for trainers")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each call to the coordinator")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", log_level, "Least level logged: info, warning or error")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  if (auto status = hyscale::util::SetMinLogLevel(log_level); !status.ok()) {
    hyscale::util::LogError(status.message());
    return kExitBadInput;
  }
  if (server.empty()) server = "127.0.0.1:50051";

  hyscale::agent::AgentOptions options;
  auto resolved_token = hyscale::rpc::ResolveToken(token, token_file, "HYSCALE_TOKEN");
  if (!resolved_token.ok()) {
    hyscale::util::LogError(resolved_token.status().message());
    return kExitBadInput;
  }
  options.client = {server, *resolved_token, tls_ca, std::chrono::milliseconds(timeout_ms)};
  options.name = name;
  options.address = address.empty() ? name : address;
  if (devices_text.empty()) {
    options.devices = hyscale::agent::DetectDevices();
  } else {
    auto devices = hyscale::agent::ParseDeviceOverride(devices_text);
    if (!devices.ok()) {
      hyscale::util::LogError(devices.status().message());
      return kExitBadInput;
    }
    options.devices = *std::move(devices);
  }
  options.trainer_path = trainer.empty() ? FindTrainer() : trainer;
  if (options.trainer_path.empty()) {
    hyscale::util::LogError(
        "trainer: hyscale-train not found next to hyscale-worker, in ../trainer or on PATH; pass "
        "--trainer");
    return kExitBadInput;
  }
  std::error_code error;
  fs::create_directories(work_dir, error);
  if (error) {
    hyscale::util::LogError("work-dir: cannot create ", work_dir, ": ", error.message());
    return kExitFailed;
  }
  options.work_dir = fs::absolute(work_dir).string();
  options.data_roots = data_roots;
  options.checkpoint_roots = checkpoint_roots;
  auto trainer_user = ResolveRunAs(run_as);
  if (!trainer_user.ok()) {
    hyscale::util::LogError(trainer_user.status().message());
    return kExitBadInput;
  }
  options.run_as = *trainer_user;
  if (options.run_as) {
    if (auto status = CheckRunAs(*options.run_as, options.trainer_path, options.work_dir);
        !status.ok()) {
      hyscale::util::LogError(status.message());
      return kExitFailed;
    }
  }
  options.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  options.stop_grace = std::chrono::milliseconds(stop_grace_ms);

  // Signals are taken by one thread with sigwait; every other thread (and, once they unblock it,
  // the trainers) never sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  hyscale::agent::Agent agent(options);
  std::thread signal_thread([&agent, signals] {
    int received = 0;
    sigwait(&signals, &received);
    hyscale::util::LogInfo(strsignal(received), ": stopping trainers");
    agent.Shutdown();
  });
  signal_thread.detach();

  const absl::Status status = agent.Run();
  if (!status.ok()) {
    hyscale::util::LogError(status.message());
    return kExitFailed;
  }
  hyscale::util::LogInfo("stopped");
  return kExitOk;
}
