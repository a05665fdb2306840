// `hyscale up`: the embedded default deployment. Starts hyscaled and one hyscale-worker as child
// processes (their output in <data-dir>/*.log), waits until the coordinator answers and the worker
// is registered, then either runs one job to its end and stops both (-f), or serves until Ctrl-C.
#include <absl/strings/str_cat.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "client/commands/commands.h"
#include "util/subprocess.h"

namespace hyscale::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{200};
constexpr std::chrono::seconds kWorkerStopGrace{20};  // the worker stops its trainers first
constexpr std::chrono::seconds kCoordinatorStopGrace{10};
constexpr milliseconds kCancelTimeout{3000};  // Ctrl-C's cancel of the job `up -f` runs

// Which child, for messages: its name and its log file.
struct ChildLabel {
  std::string name;
  std::string log_path;
};

struct Child {
  ChildLabel label;
  util::Subprocess process;
};

// <dir of this binary>/<name> (installed layout) or <dir>/../<build_path> (build layout).
absl::StatusOr<std::string> FindBinary(const std::string& name, const std::string& build_path) {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) return absl::NotFoundError(absl::StrCat(name, ": cannot locate the hyscale binary"));
  const fs::path installed = self.parent_path() / name;
  const fs::path built = self.parent_path() / ".." / build_path;
  for (const fs::path& candidate : {installed, built}) {
    if (fs::is_regular_file(candidate, error) && access(candidate.c_str(), X_OK) == 0) {
      return fs::weakly_canonical(candidate, error).string();
    }
  }
  return absl::NotFoundError(absl::StrCat(name, ": not found at ", installed.string(), " or ",
                                          fs::weakly_canonical(built, error).string()));
}

// Starts `program` with output appended to `log_path`, in its own process group (Ctrl-C reaches
// only us; we stop the children in order), sent SIGTERM if we die.
absl::StatusOr<Child> Spawn(const std::string& name, const std::string& program,
                            const std::vector<std::string>& args, const std::string& token,
                            const std::string& log_path) {
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), args.begin(), args.end());
  util::Command command(std::move(argv));
  // The token travels in the environment, not argv, so `ps` does not show it.
  if (token.empty()) {
    command.unset_env = {"HYSCALE_TOKEN"};
  } else {
    command.env = {{"HYSCALE_TOKEN", token}};
  }
  command.stdout_to = util::Redirect::AppendTo(log_path);
  command.stderr_to = util::Redirect::ToStdout();
  command.new_process_group = true;
  command.parent_death_signal = SIGTERM;
  auto process = util::Subprocess::Start(command);
  // INTERNAL whatever the cause: `up` exits 7 whether a child cannot start or dies at once.
  if (!process.ok())
    return absl::InternalError(absl::StrCat(name, ": ", process.status().message()));
  return Child{{name, log_path}, *std::move(process)};
}

// The last lines of a child's log, for an error message.
std::string Tail(const std::string& path, size_t lines = 15) {
  std::ifstream in(path);
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string text;
  for (const auto& line : last) absl::StrAppend(&text, "  | ", line, "\n");
  return text;
}

// Both children, stopped once, worker first so it can stop its trainers and report.
class Children {
 public:
  void Add(Child child) {
    std::lock_guard<std::mutex> lock(mu_);
    children_.push_back(std::move(child));
  }
  void StopAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
      it->process.Stop(it->label.name == "hyscale-worker" ? kWorkerStopGrace
                                                          : kCoordinatorStopGrace);
    }
  }
  // The first child that exited on its own, if any.
  std::optional<ChildLabel> FirstExited() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& child : children_) {
      if (child.process.TryWait()) return child.label;
    }
    return std::nullopt;
  }

 private:
  std::mutex mu_;
  std::vector<Child> children_;
};

// Polls `ready` until it returns OK, a child dies, or the timeout passes.
absl::Status WaitUntil(const std::string& what, Children& children, std::chrono::seconds timeout,
                       const std::function<bool()>& ready) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (ready()) return absl::OkStatus();
    if (auto dead = children.FirstExited()) {
      return absl::InternalError(absl::StrCat(dead->name, " exited while waiting for ", what,
                                              "; its log ", dead->log_path, " ends:\n",
                                              Tail(dead->log_path)));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("timed out after ", timeout.count(), " s waiting for ", what));
}

// The job `up -f` runs, once the coordinator took it (set by the main thread, read by the one that
// handles Ctrl-C).
class SubmittedJob {
 public:
  void Set(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    id_ = id;
  }
  std::string Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return id_;
  }

 private:
  std::mutex mu_;
  std::string id_;
};

// Ctrl-C cancels the job `up -f` runs before its worker stops, which would otherwise end the
// attempt as a disruption: the job would stay in the data folder, to run again beside the next
// run's own job. Bounded; says what happened on err.
void CancelInterruptedJob(Context context, const std::string& job_id) {
  context.client.timeout = kCancelTimeout;
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason("hyscale up was interrupted");
  const auto cancelled = CallJobService(context, &v1::JobService::Stub::CancelJob, request);
  if (cancelled.ok()) {
    *context.err << "hyscale: up: job " << job_id << " cancelled\n" << std::flush;
  } else {
    *context.err << "hyscale: up: job " << job_id
                 << " not cancelled: " << cancelled.status().message() << "\n"
                 << std::flush;
  }
}

// The first folder on the way to `path` (or `path` itself) that other users cannot pass through
// (no search bit for others), or "" when there is none.
std::string ClosedToOthers(const std::filesystem::path& path) {
  std::error_code error;
  auto at = std::filesystem::weakly_canonical(path, error);
  if (error) return path.string();
  for (; !at.empty(); at = at.parent_path()) {
    struct stat info {};
    if (::stat(at.c_str(), &info) == 0 && (info.st_mode & S_IXOTH) == 0) return at.string();
    if (at == at.root_path()) break;
  }
  return "";
}

}  // namespace

int Up(const Context& context, const UpArgs& args) {
  if (!context.client.tls_ca_file.empty()) {
    return Fail(context, "up",
                absl::InvalidArgumentError("--tls-ca: the local coordinator serves plaintext"));
  }
  auto coordinator_binary = FindBinary("hyscaled", "server/hyscaled");
  if (!coordinator_binary.ok()) return Fail(context, "up", coordinator_binary.status());
  auto worker_binary = FindBinary("hyscale-worker", "worker/agent/hyscale-worker");
  if (!worker_binary.ok()) return Fail(context, "up", worker_binary.status());
  // A job spec is checked before anything starts.
  if (!args.file.empty()) {
    if (auto spec = LoadValidSpec(args.file); !spec.ok()) return Fail(context, "up", spec.status());
  }
  std::error_code error;
  fs::create_directories(args.data_dir, error);
  if (error) {
    return Fail(context, "up",
                absl::InvalidArgumentError(absl::StrCat("--data-dir: cannot create ", args.data_dir,
                                                        ": ", error.message())));
  }
  const fs::path data_dir = fs::absolute(args.data_dir);

  // Ctrl-C and SIGTERM go to a thread that stops the children in order; blocked before any
  // thread (gRPC's included) exists, so they all inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto children = std::make_shared<Children>();
  auto submitted = std::make_shared<SubmittedJob>();
  const bool serving = args.file.empty();
  std::thread([children, submitted, signals, serving, context] {
    int received = 0;
    sigwait(&signals, &received);
    *context.err << "\nhyscale: up: stopping the worker and the coordinator\n" << std::flush;
    if (const std::string job_id = submitted->Get(); !job_id.empty()) {
      CancelInterruptedJob(context, job_id);
    }
    children->StopAll();
    context.out->flush();
    _exit(serving ? kExitOk : kExitJobFailed);
  }).detach();

  std::vector<std::string> coordinator_args = {
      "--listen",          context.client.server,
      "--data-dir",        (data_dir / "coordinator").string(),
      "--checkpoint-root", (data_dir / "checkpoints").string()};
  // The worker is local: its silence means a process starved on a machine the trainer fills, not
  // a partition, so it is lost after 15 s rather than hyscaled's default 3 (a stall of over 3 s
  // of a 2-core machine once failed the README's demo at step 425 of 450).
  coordinator_args.insert(coordinator_args.end(), {"--heartbeat-timeout-ms", "15000"});
  if (!args.metrics_listen.empty()) {
    coordinator_args.insert(coordinator_args.end(), {"--metrics-listen", args.metrics_listen});
  }
  // Probes use their own channel, retrying connections every 100-250 ms.
  grpc::ChannelArguments probe_arguments;
  probe_arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  probe_arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  probe_arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  const auto probe_channel = grpc::CreateCustomChannel(
      context.client.server, grpc::InsecureChannelCredentials(), probe_arguments);
  const auto jobs = v1::JobService::NewStub(probe_channel);
  const auto workers = v1::WorkerService::NewStub(probe_channel);
  // Healthy once it answers: an unknown job is NOT_FOUND (UNAUTHENTICATED from one with another
  // token). Waiting for the channel to be ready
  // (rather than failing fast with the last connection error) notices the coordinator as soon
  // as it listens.
  const auto coordinator_answers = [&](bool wait_for_ready) {
    grpc::ClientContext call;
    rpc::PrepareCall(&call, context.client, milliseconds(1000));
    call.set_wait_for_ready(wait_for_ready);
    v1::GetJobRequest request;
    request.set_job_id("hyscale-up-probe");
    v1::Job job;
    const auto code = jobs->GetJob(&call, request, &job).error_code();
    return code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::OK ||
           code == grpc::StatusCode::UNAUTHENTICATED;
  };
  // Our worker must not register with some other coordinator that already has the address.
  if (coordinator_answers(/*wait_for_ready=*/false)) {
    return Fail(context, "up",
                absl::FailedPreconditionError(
                    absl::StrCat("--server ", context.client.server,
                                 ": a coordinator already listens there; pick another address")));
  }

  auto coordinator = Spawn("hyscaled", *coordinator_binary, coordinator_args, context.client.token,
                           (data_dir / "hyscaled.log").string());
  if (!coordinator.ok()) return Fail(context, "up", coordinator.status());
  children->Add(*std::move(coordinator));

  absl::Status status = WaitUntil("the coordinator", *children, args.start_timeout,
                                  [&] { return coordinator_answers(/*wait_for_ready=*/true); });
  if (!status.ok()) {
    children->StopAll();
    return Fail(context, "up", status);
  }

  std::vector<std::string> worker_args = {"--server",
                                          context.client.server,
                                          "--name",
                                          args.worker_name,
                                          "--address",
                                          "127.0.0.1",
                                          "--work-dir",
                                          (data_dir / "worker").string(),
                                          "--checkpoint-root",
                                          (data_dir / "checkpoints").string()};
  if (!args.devices.empty()) worker_args.insert(worker_args.end(), {"--devices", args.devices});
  if (!args.trainer.empty()) worker_args.insert(worker_args.end(), {"--trainer", args.trainer});
  // As root the worker runs trainers as nobody, who must reach the trainer (beside the worker) and
  // the data folder. `hyscale up` is one user's own service: where a folder on the way is closed
  // (a clone or data folder under a 0700 home), its trainers run as that user instead.
  std::string run_as = args.run_as;
  if (run_as.empty() && ::geteuid() == 0) {
    for (const std::filesystem::path& needed : {std::filesystem::path(*worker_binary), data_dir}) {
      if (const std::string closed = ClosedToOthers(needed); !closed.empty() && run_as.empty()) {
        run_as = "root";
        *context.err << "hyscale: up: " << closed
                     << " is closed to other users, so the worker's trainers run as root "
                        "(--run-as names another user)\n";
      }
    }
  }
  if (!run_as.empty()) worker_args.insert(worker_args.end(), {"--run-as", run_as});
  auto worker = Spawn("hyscale-worker", *worker_binary, worker_args, context.client.token,
                      (data_dir / "hyscale-worker.log").string());
  if (!worker.ok()) {
    children->StopAll();
    return Fail(context, "up", worker.status());
  }
  children->Add(*std::move(worker));

  status = WaitUntil("the worker to register", *children, args.start_timeout, [&] {
    grpc::ClientContext call;
    rpc::PrepareCall(&call, context.client, milliseconds(1000));
    call.set_wait_for_ready(true);
    v1::ListWorkersResponse response;
    if (!workers->ListWorkers(&call, v1::ListWorkersRequest(), &response).ok()) return false;
    for (const auto& info : response.workers()) {
      if (info.id() == args.worker_name && info.state() == v1::WORKER_STATE_ONLINE) return true;
    }
    return false;
  });
  if (!status.ok()) {
    children->StopAll();
    return Fail(context, "up", status);
  }
  *context.err << "hyscale: up: coordinator on " << context.client.server << ", worker "
               << args.worker_name << " registered; logs in " << data_dir.string() << "\n"
               << std::flush;

  if (serving) {
    *context.err << "hyscale: up: serving; Ctrl-C stops both\n" << std::flush;
    while (true) {
      if (auto dead = children->FirstExited()) {
        children->StopAll();
        return Fail(
            context, "up",
            absl::InternalError(absl::StrCat(dead->name, " exited; its log ", dead->log_path,
                                             " ends:\n", Tail(dead->log_path))));
      }
      std::this_thread::sleep_for(milliseconds(500));
    }
  }
  SubmitArgs submit = args.submit;
  submit.watch = true;
  const int code =
      Submit(context, submit, [&submitted](const std::string& id) { submitted->Set(id); });
  children->StopAll();
  return code;
}

}  // namespace hyscale::cli
