#include "worker/agent/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "proto/events.h"
#include "proto/job_spec.h"
#include "tests/agent/fake_coordinator.h"
#include "tests/agent/fake_trainer.h"
#include "util/temp_dir.h"
#include "worker/agent/devices.h"

namespace hyscale::agent {
namespace {

using std::chrono::milliseconds;
using testing::FakeCoordinator;
using testing::FakeWorkerService;

v1::Assignment RunAssignment(const std::string& mode, const std::string& job, int attempt = 0) {
  v1::Assignment assignment;
  v1::RunRank* run = assignment.mutable_run();
  run->mutable_ref()->set_job_id(job);
  run->mutable_ref()->set_rank(0);
  run->mutable_ref()->set_attempt(attempt);
  run->set_world_size(1);
  run->mutable_spec()->set_name(mode);
  return assignment;
}

v1::Assignment StopAssignment(const std::string& job, const std::string& reason) {
  v1::Assignment assignment;
  assignment.mutable_stop()->mutable_ref()->set_job_id(job);
  assignment.mutable_stop()->set_reason(reason);
  return assignment;
}

// Reports about `job`, in the order the coordinator received them.
std::vector<v1::RankReport> ReportsOf(const std::vector<v1::RankReport>& reports,
                                      const std::string& job) {
  std::vector<v1::RankReport> selected;
  for (const auto& report : reports) {
    if (report.ref().job_id() == job) selected.push_back(report);
  }
  return selected;
}

bool HasExit(const std::vector<v1::RankReport>& reports, const std::string& job) {
  for (const auto& report : reports) {
    if (report.ref().job_id() == job && report.has_exited()) return true;
  }
  return false;
}

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() : coordinator_(std::make_unique<FakeCoordinator>()) {}
  ~AgentTest() override { StopAgent(); }

  void StartAgent() {
    AgentOptions options;
    options.client.server = coordinator_->address();
    options.client.timeout = milliseconds(2000);
    options.name = "worker-a";
    options.address = "127.0.0.1";
    options.devices = *ParseDeviceOverride("cpu:2");
    options.work_dir = dir_.path() + "/work";
    options.trainer_path = testing::WriteFakeTrainer(dir_.path());
    options.stop_grace = milliseconds(2000);
    options.report_linger = milliseconds(20);
    options.backoff_initial = milliseconds(50);
    options.backoff_max = milliseconds(300);
    agent_ = std::make_unique<Agent>(options);
    runner_ = std::thread([this] { EXPECT_TRUE(agent_->Run().ok()); });
  }

  void StopAgent() {
    if (!agent_) return;
    agent_->Shutdown();
    runner_.join();
    agent_.reset();
  }

  FakeWorkerService& service() { return coordinator_->service(); }

  bool WaitForExit(const std::string& job) {
    auto& fake = service();
    return fake.WaitUntil([&] { return HasExit(fake.reports_locked(), job); });
  }

  bool WaitForStream() {
    auto& fake = service();
    return fake.WaitUntil([&] { return fake.open_streams_locked() > 0; });
  }

  const util::TempDir dir_ = util::TempDir::Create("hyscale-agent").value();
  std::unique_ptr<FakeCoordinator> coordinator_;
  std::unique_ptr<Agent> agent_;
  std::thread runner_;
};

TEST_F(AgentTest, RegistersDevices) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  const auto registrations = service().registrations();
  ASSERT_FALSE(registrations.empty());
  EXPECT_EQ(registrations[0].name(), "worker-a");
  EXPECT_EQ(registrations[0].address(), "127.0.0.1");
  ASSERT_EQ(registrations[0].devices_size(), 1);
  EXPECT_EQ(registrations[0].devices(0).count(), 2);
  EXPECT_EQ(registrations[0].running_size(), 0);
}

TEST_F(AgentTest, RunsRankAndForwardsEventsInOrder) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("ok", "job-ok"));
  ASSERT_TRUE(WaitForExit("job-ok"));
  const auto reports = ReportsOf(service().reports(), "job-ok");
  ASSERT_FALSE(reports.empty());
  EXPECT_GT(reports.front().started_pid(), 0);
  std::vector<std::string> events;
  std::string log;
  for (const auto& report : reports) {
    if (report.has_event_json()) events.push_back(report.event_json());
    if (report.has_log()) log += report.log();
  }
  ASSERT_EQ(events.size(), 5u);
  EXPECT_NE(events[0].find("job_started"), std::string::npos);
  for (int i = 1; i <= 3; ++i) {
    EXPECT_NE(events[i].find("\"step\":" + std::to_string(i)), std::string::npos) << events[i];
  }
  EXPECT_NE(events[4].find("job_finished"), std::string::npos);
  EXPECT_NE(log.find("not json, just a log line"), std::string::npos);
  ASSERT_TRUE(reports.back().has_exited());
  EXPECT_EQ(reports.back().exited().exit_code(), 0);
  EXPECT_EQ(reports.back().ref().attempt(), 0);
}

TEST_F(AgentTest, CrashIsReportedAndAgentKeepsServing) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("crash", "job-crash"));
  ASSERT_TRUE(WaitForExit("job-crash"));
  const auto crash = ReportsOf(service().reports(), "job-crash");
  EXPECT_EQ(crash.back().exited().exit_code(), 3);
  EXPECT_EQ(crash.back().exited().reason(), "exited with code 3: boom");

  service().Push(RunAssignment("ok", "job-after"));
  ASSERT_TRUE(WaitForExit("job-after"));
  EXPECT_EQ(ReportsOf(service().reports(), "job-after").back().exited().exit_code(), 0);
}

TEST_F(AgentTest, StopRankKillsTrainer) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("sleep", "job-stop"));
  auto& fake = service();
  ASSERT_TRUE(fake.WaitUntil([&] {
    for (const auto& report : fake.reports_locked()) {
      if (report.has_started_pid()) return true;
    }
    return false;
  }));
  // A stop reason longer than the coordinator takes in a field comes back shortened.
  const std::string reason = "cancelled: " + std::string(5000, 'x');
  service().Push(StopAssignment("job-stop", reason));
  ASSERT_TRUE(WaitForExit("job-stop"));
  const auto reports = ReportsOf(service().reports(), "job-stop");
  EXPECT_EQ(reports.back().exited().exit_code(), -1);
  EXPECT_EQ(reports.back().exited().signal(), SIGTERM);
  EXPECT_EQ(reports.back().exited().reason(), reason.substr(0, 2048) + "...");
  EXPECT_FALSE(reports.back().exited().worker_stopping());  // the coordinator asked
  // The rank is forgotten once the coordinator acknowledged its exit.
  for (int i = 0; i < 100 && !agent_->Running().empty(); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(agent_->Running().empty());
}

TEST_F(AgentTest, DuplicateAssignmentRunsOnce) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("sleep", "job-dup"));
  service().Push(RunAssignment("sleep", "job-dup"));
  auto& fake = service();
  ASSERT_TRUE(fake.WaitUntil([&] { return !fake.reports_locked().empty(); }));
  std::this_thread::sleep_for(milliseconds(300));
  int started = 0;
  for (const auto& report : service().reports()) started += report.has_started_pid() ? 1 : 0;
  EXPECT_EQ(started, 1);
  EXPECT_EQ(agent_->Running().size(), 1u);
}

TEST_F(AgentTest, ReconnectsAfterCoordinatorRestartWithRanksStillRunning) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("slow", "job-slow"));
  auto& fake = service();
  ASSERT_TRUE(fake.WaitUntil([&] {
    for (const auto& report : fake.reports_locked()) {
      if (report.has_started_pid()) return true;
    }
    return false;
  }));
  const int port = coordinator_->port();
  coordinator_->Stop();
  // The trainer keeps going while the coordinator is away; its reports queue up.
  std::this_thread::sleep_for(milliseconds(800));
  coordinator_ = std::make_unique<FakeCoordinator>(port);
  ASSERT_EQ(coordinator_->port(), port);
  ASSERT_TRUE(WaitForExit("job-slow"));

  // It registered again, listing the rank it still runs, so nothing starts twice.
  const auto registrations = service().registrations();
  ASSERT_FALSE(registrations.empty());
  ASSERT_EQ(registrations[0].running_size(), 1);
  EXPECT_EQ(registrations[0].running(0).job_id(), "job-slow");
  // Reports sent after the restart continue in order: step numbers increase, no duplicates.
  int64_t last_step = 0;
  for (const auto& report : ReportsOf(service().reports(), "job-slow")) {
    EXPECT_FALSE(report.has_started_pid());
    if (!report.has_event_json()) continue;
    const auto event = ParseEventLine(report.event_json());
    ASSERT_TRUE(event.ok()) << event.status();
    if (!event->has_step()) continue;
    EXPECT_GT(event->step().step(), last_step);
    last_step = event->step().step();
  }
  EXPECT_EQ(last_step, 10);
}

TEST_F(AgentTest, RegistersPromptlyWhenCoordinatorReturns) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  const int port = coordinator_->port();
  coordinator_->Stop();
  // Long enough for the channel to back off; the registration still follows the return closely.
  std::this_thread::sleep_for(milliseconds(2500));
  coordinator_ = std::make_unique<FakeCoordinator>(port);
  const auto back = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitForStream());
  // Bounded by the channel's own reconnect backoff (rpc::Connect caps it at 2 s), not ours.
  EXPECT_LT(std::chrono::steady_clock::now() - back, std::chrono::seconds(4));
}

TEST_F(AgentTest, RegistersAgainWhenCoordinatorForgetsIt) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Forget("worker-a");
  auto& fake = service();
  ASSERT_TRUE(fake.WaitUntil([&] { return fake.registrations_locked().size() >= 2; }));
}

TEST_F(AgentTest, ShutdownStopsTrainersAndReportsExit) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("sleep", "job-shutdown"));
  auto& fake = service();
  ASSERT_TRUE(fake.WaitUntil([&] { return !fake.reports_locked().empty(); }));
  StopAgent();
  const auto reports = ReportsOf(service().reports(), "job-shutdown");
  ASSERT_TRUE(reports.back().has_exited());
  EXPECT_EQ(reports.back().exited().reason(), "worker shutting down");
  EXPECT_TRUE(reports.back().exited().worker_stopping());  // not the job's failure
  // Its trainer gone and the exit delivered, it left: one last heartbeat, running nothing.
  const auto beats = service().heartbeats();
  ASSERT_FALSE(beats.empty());
  EXPECT_TRUE(beats.back().leaving());
  EXPECT_EQ(beats.back().running_size(), 0);
  EXPECT_EQ(std::count_if(beats.begin(), beats.end(),
                          [](const v1::HeartbeatRequest& beat) { return beat.leaving(); }),
            1);
}

TEST_F(AgentTest, RetriesRegistrationUntilCoordinatorComesUp) {
  const int port = coordinator_->port();
  coordinator_->Stop();
  StartAgent();
  std::this_thread::sleep_for(milliseconds(500));
  coordinator_ = std::make_unique<FakeCoordinator>(port);
  ASSERT_TRUE(WaitForStream());
  service().Push(RunAssignment("ok", "job-late"));
  ASSERT_TRUE(WaitForExit("job-late"));
}

// A context-parallel job through the agent: rank 0 is given port 0 and its rendezvous event (the
// store it serves) reaches the coordinator; rank 1 then runs with the published address.
TEST_F(AgentTest, ContextParallelRanksGetTheirRendezvous) {
  StartAgent();
  ASSERT_TRUE(WaitForStream());
  auto& fake = service();
  const auto exited = [&](int rank) {
    return fake.WaitUntil([&] {
      for (const auto& report : fake.reports_locked()) {
        if (report.ref().job_id() == "job-cp" && report.ref().rank() == rank &&
            report.has_exited()) {
          return true;
        }
      }
      return false;
    });
  };
  // The event of kind `kind` of `rank`, and its exit code.
  const auto outcome = [&](int rank, const std::string& kind) {
    std::pair<v1::TrainerEventLine, int> result{{}, -2};
    for (const auto& report : ReportsOf(fake.reports(), "job-cp")) {
      if (report.ref().rank() != rank) continue;
      const auto event = ParseEventLine(report.event_json());
      if (report.has_event_json() && event.ok() && EventKind(*event) == kind) result.first = *event;
      if (report.has_exited()) result.second = report.exited().exit_code();
    }
    return result;
  };

  v1::Assignment rank0 = RunAssignment("rendezvous", "job-cp");
  rank0.mutable_run()->set_world_size(2);
  rank0.mutable_run()->set_rendezvous("127.0.0.1:0");
  fake.Push(rank0);
  ASSERT_TRUE(exited(0));
  const auto [published, code0] = outcome(0, "rendezvous");
  EXPECT_EQ(code0, 0);
  EXPECT_EQ(published.rendezvous().address(), "127.0.0.1:29517");
  EXPECT_EQ(published.rendezvous().world_size(), 2);

  v1::Assignment rank1 = rank0;
  rank1.mutable_run()->mutable_ref()->set_rank(1);
  rank1.mutable_run()->set_device_index(1);
  rank1.mutable_run()->set_rendezvous("127.0.0.1:29517");
  fake.Push(rank1);
  ASSERT_TRUE(exited(1));
  const auto [joined, code1] = outcome(1, "warning");
  EXPECT_EQ(code1, 0);
  EXPECT_EQ(joined.warning(), "joined 127.0.0.1:29517");
}

// With HYSCALE_TEST_TRAINER pointing at a built hyscale-train (tests/agent/CMakeLists.txt sets it
// to this build's), a tiny real job runs end to end through the agent: real event lines,
// checkpoints in the assigned directory under the worker's checkpoint root, exit 0.
TEST(AgentRealTrainerTest, TrainsTinyJob) {
  const char* trainer = std::getenv("HYSCALE_TEST_TRAINER");
  if (trainer == nullptr) GTEST_SKIP() << "set HYSCALE_TEST_TRAINER to a built hyscale-train";
  auto spec = hyscale::ParseJobSpec(R"(name: tiny
seed: 1
model: {vocab_size: 160, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 16}}
data: {seq_len: 64, batch_size: 2, recall: {pairs: 4, queries: 4, key_vocab: 64, value_vocab: 64}}
stages: [{name: dense, steps: 20, lr: 1.0e-3, attention: DENSE, trains: ALL}]
checkpoint: {every_steps: 5}
log_every: 5
threads: 1
)",
                                    hyscale::SpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const util::TempDir dir = util::TempDir::Create("hyscale-agent").value();
  FakeCoordinator coordinator;
  AgentOptions options;
  options.client.server = coordinator.address();
  options.name = "real";
  options.devices = *ParseDeviceOverride("cpu:1");
  options.work_dir = dir.path() + "/work";
  options.trainer_path = trainer;
  options.checkpoint_roots = {dir.path() + "/checkpoints"};
  Agent agent(options);
  std::thread runner([&] { EXPECT_TRUE(agent.Run().ok()); });
  auto& fake = coordinator.service();
  ASSERT_TRUE(fake.WaitUntil([&] { return fake.open_streams_locked() > 0; }));
  v1::Assignment assignment;
  assignment.mutable_run()->mutable_ref()->set_job_id("real-job");
  assignment.mutable_run()->set_world_size(1);
  assignment.mutable_run()->set_checkpoint_dir(dir.path() + "/checkpoints/real-job");
  *assignment.mutable_run()->mutable_spec() = *spec;
  fake.Push(assignment);
  const bool exited = fake.WaitUntil([&] { return HasExit(fake.reports_locked(), "real-job"); },
                                     std::chrono::seconds(120));
  agent.Shutdown();
  runner.join();
  ASSERT_TRUE(exited);
  const auto reports = ReportsOf(fake.reports(), "real-job");
  int steps = 0, checkpoints = 0;
  for (const auto& report : reports) {
    const auto event = ParseEventLine(report.event_json());
    if (!report.has_event_json() || !event.ok()) continue;
    if (event->has_step()) ++steps;
    if (event->has_checkpoint_written()) ++checkpoints;
  }
  EXPECT_GE(steps, 4);
  EXPECT_GE(checkpoints, 1);
  EXPECT_EQ(reports.back().exited().exit_code(), 0) << reports.back().exited().reason();
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/checkpoints/real-job"));
}

}  // namespace
}  // namespace hyscale::agent
