// hyscaled as a process: flags, the printed port, exit codes, SIGTERM, recovery after SIGKILL,
// auth and TLS over the wire.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "tests/server/test_util.h"
#include "util/subprocess.h"

namespace hyscale::server {
namespace {

// A running hyscaled with its stdout on a pipe; killed if the test ends before it does.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& args) {
    util::Command command({HYSCALED_PATH});
    command.argv.insert(command.argv.end(), args.begin(), args.end());
    command.stdout_to = util::Redirect::Pipe();
    auto started = util::Subprocess::Start(command);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    process_ = *std::move(started);
    stdout_ = process_->TakeStdout();
  }

  // The port from "hyscaled: listening on HOST:PORT", or 0 if it exits or stays silent.
  int WaitForPort() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::string text;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd fd{stdout_.get(), POLLIN, 0};
      if (::poll(&fd, 1, 100) <= 0) continue;
      char buffer[256];
      const ssize_t got = ::read(stdout_.get(), buffer, sizeof(buffer));
      if (got <= 0) return 0;
      text.append(buffer, got);
      const auto at = text.find("hyscaled: listening on ");
      const auto end = at == std::string::npos ? at : text.find('\n', at);
      if (end != std::string::npos) {
        const std::string line = text.substr(at, end - at);
        return std::atoi(line.substr(line.rfind(':') + 1).c_str());
      }
    }
    return 0;
  }

  // Sends `signal` (0: none) and waits up to `timeout` for the exit code.
  std::optional<int> Stop(int signal, std::chrono::seconds timeout = std::chrono::seconds(15)) {
    if (!process_) return std::nullopt;
    if (signal != 0) process_->Signal(signal);
    const auto exit = process_->WaitFor(timeout);
    if (!exit) return std::nullopt;
    return exit->ShellCode();
  }

 private:
  std::optional<util::Subprocess> process_;
  util::UniqueFd stdout_;
};

std::unique_ptr<v1::JobService::Stub> Jobs(const std::string& server, const std::string& ca = "") {
  rpc::ClientOptions options;
  options.server = server;
  options.tls_ca_file = ca;
  auto channel = rpc::Connect(options);
  EXPECT_TRUE(channel.ok());
  return v1::JobService::NewStub(*channel);
}

grpc::Status Submit(v1::JobService::Stub* jobs, const std::string& token, v1::Job* job) {
  grpc::ClientContext context;
  rpc::ClientOptions options;
  options.token = token;
  rpc::PrepareCall(&context, options, std::chrono::seconds(10));
  return jobs->SubmitJob(&context, testing::SubmitRequest(), job);
}

grpc::Status Get(v1::JobService::Stub* jobs, const std::string& id, v1::Job* job,
                 const std::string& token = "") {
  grpc::ClientContext context;
  rpc::ClientOptions options;
  options.token = token;
  rpc::PrepareCall(&context, options, std::chrono::seconds(10));
  v1::GetJobRequest request;
  request.set_job_id(id);
  return jobs->GetJob(&context, request, job);
}

TEST(HyscaledProcessTest, BadFlagsExit2) {
  Daemon no_data_dir({"--listen", "127.0.0.1:0"});
  EXPECT_EQ(no_data_dir.Stop(0), 2);
  Daemon bad_interval({"--data-dir", testing::ScratchDir(), "--heartbeat-interval-ms", "-5"});
  EXPECT_EQ(bad_interval.Stop(0), 2);
}

TEST(HyscaledProcessTest, CannotStartExit1) {
  Daemon unwritable({"--data-dir", "/dev/null/hyscale", "--listen", "127.0.0.1:0"});
  EXPECT_EQ(unwritable.Stop(0), 1);
  Daemon half_tls({"--data-dir", testing::ScratchDir(), "--listen", "127.0.0.1:0", "--tls-cert",
                   "/nonexistent.pem", "--metrics-listen", "127.0.0.1:0"});
  EXPECT_EQ(half_tls.Stop(0), 1);
}

TEST(HyscaledProcessTest, ServesOnPrintedPortAndStopsOnSigterm) {
  const std::string dir = testing::ScratchDir();
  Daemon daemon({"--data-dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0);
  auto jobs = Jobs("127.0.0.1:" + std::to_string(port));
  v1::Job job;
  EXPECT_EQ(Get(jobs.get(), "job-none", &job).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Submit(jobs.get(), "", &job).ok());  // no token configured: auth off
  // A watch open at shutdown does not hold the daemon up: the server ends it.
  grpc::ClientContext watch_context;
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto reader = jobs->WatchJob(&watch_context, watch);
  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  std::thread drain([&] {
    while (reader->Read(&event)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
    // Close the connection: an idle one would hold the shutdown until the grace ends.
    reader.reset();
    jobs.reset();
  });
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
  drain.join();
  EXPECT_TRUE(std::filesystem::exists(dir + "/hyscale.db"));
}

TEST(HyscaledProcessTest, JobsSurviveSigkillAndTokenIsEnforced) {
  const std::string dir = testing::ScratchDir();
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "tok3n\n";
  const std::vector<std::string> args = {
      "--data-dir",   dir,        "--listen",         "127.0.0.1:0",
      "--token-file", token_file, "--metrics-listen", "127.0.0.1:0"};
  v1::Job job;
  {
    Daemon daemon(args);
    const int port = daemon.WaitForPort();
    ASSERT_GT(port, 0);
    auto jobs = Jobs("127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(Submit(jobs.get(), "", &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Submit(jobs.get(), "wrong", &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    ASSERT_TRUE(Submit(jobs.get(), "tok3n", &job).ok());
    EXPECT_EQ(daemon.Stop(SIGKILL), 128 + SIGKILL);
  }
  Daemon daemon(args);
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0);
  auto jobs = Jobs("127.0.0.1:" + std::to_string(port));
  v1::Job recovered;
  EXPECT_EQ(Get(jobs.get(), job.id(), &recovered).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(Get(jobs.get(), job.id(), &recovered, "tok3n").ok());
  EXPECT_EQ(recovered.state(), v1::JOB_STATE_PENDING);
  // An idle client connection would hold the shutdown until the client polls it (its backup
  // poller runs every 5 s); closing it lets the daemon exit at once.
  jobs.reset();
  EXPECT_EQ(daemon.Stop(SIGINT, std::chrono::seconds(3)), 0);
}

// A worker that registers and heartbeats but never starts what it is given (a fake agent here):
// after --start-timeout-ms its job runs on the other worker, and it is excluded from placement.
TEST(HyscaledProcessTest, WorkerThatNeverStartsIsExcludedAndItsJobMoves) {
  const std::string dir = testing::ScratchDir();
  Daemon daemon({"--data-dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                 "--heartbeat-interval-ms", "200", "--start-timeout-ms", "1000",
                 "--restart-backoff-ms", "100"});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0);
  rpc::ClientOptions client;
  client.server = "127.0.0.1:" + std::to_string(port);
  auto channel = rpc::Connect(client);
  ASSERT_TRUE(channel.ok());
  auto workers = v1::WorkerService::NewStub(*channel);
  auto jobs = v1::JobService::NewStub(*channel);
  const auto call = [](grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  };
  const auto register_worker = [&](const std::string& name) {
    grpc::ClientContext context;
    call(&context);
    v1::RegisterWorkerResponse response;
    return workers->RegisterWorker(&context, testing::WorkerRequest(name, 1), &response).ok();
  };
  ASSERT_TRUE(register_worker("stuck"));
  v1::Job job;
  ASSERT_TRUE(Submit(jobs.get(), "", &job).ok());
  ASSERT_EQ(job.placement(0).worker_id(), "stuck");
  ASSERT_TRUE(register_worker("good"));

  // Both heartbeat; "good" starts what it is sent (it reports the rank in its heartbeats).
  v1::Job moved;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(Get(jobs.get(), job.id(), &moved).ok());
    for (const std::string name : {"stuck", "good"}) {
      grpc::ClientContext context;
      call(&context);
      v1::HeartbeatRequest beat;
      beat.set_worker_id(name);
      if (name == "good" && moved.placement_size() == 1 &&
          moved.placement(0).worker_id() == "good") {
        auto* ref = beat.add_running();
        ref->set_job_id(job.id());
        ref->set_attempt(moved.restarts());
      }
      v1::HeartbeatResponse response;
      ASSERT_TRUE(workers->Heartbeat(&context, beat, &response).ok());
    }
    if (moved.state() == v1::JOB_STATE_RUNNING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(moved.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(moved.placement_size(), 1);
  EXPECT_EQ(moved.placement(0).worker_id(), "good");
  EXPECT_EQ(moved.restarts(), 1);
  grpc::ClientContext context;
  call(&context);
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(workers->ListWorkers(&context, {}, &listed).ok());
  for (const auto& worker : listed.workers()) {
    EXPECT_EQ(worker.has_unhealthy_until(), worker.id() == "stuck") << worker.id();
  }
  workers.reset();
  jobs.reset();
  channel->reset();
  EXPECT_EQ(daemon.Stop(SIGTERM, std::chrono::seconds(5)), 0);
}

TEST(HyscaledProcessTest, ServesTls) {
  const std::string dir = testing::ScratchDir();
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext "
      "subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      dir + "/key.pem -out " + dir + "/cert.pem >/dev/null 2>&1";
  if (std::system(command.c_str()) != 0) GTEST_SKIP() << "openssl cannot make a certificate";
  Daemon daemon({"--data-dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                 "--tls-cert", dir + "/cert.pem", "--tls-key", dir + "/key.pem"});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0);
  auto tls = Jobs("localhost:" + std::to_string(port), dir + "/cert.pem");
  v1::Job job;
  EXPECT_EQ(Get(tls.get(), "job-none", &job).error_code(), grpc::StatusCode::NOT_FOUND);
  auto plaintext = Jobs("127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(Get(plaintext.get(), "job-none", &job).error_code(), grpc::StatusCode::UNAVAILABLE);
  tls.reset();
  plaintext.reset();
  EXPECT_EQ(daemon.Stop(SIGTERM, std::chrono::seconds(3)), 0);
}

}  // namespace
}  // namespace hyscale::server
