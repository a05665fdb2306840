// The coordinator's state machine, driven in-process with a fake clock: no gRPC, no threads
// except where a stream must block.
#include "server/coordinator.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <map>
#include <thread>

#include "planner/cost_model.h"
#include "proto/job_spec.h"
#include "server/trainer_events.h"
#include "tests/server/test_util.h"

namespace hyscale::server {
namespace {

using testing::ScratchDir;
using testing::SubmitRequest;
using testing::WorkerRequest;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir();
    Open();
  }

  void Open() {
    CoordinatorOptions options;
    options.data_dir = dir_;
    options.heartbeat_interval = absl::Seconds(1);
    options.heartbeat_timeout = absl::Seconds(3);
    options.restart_backoff = absl::Seconds(1);
    options.recovery_grace = absl::Seconds(5);
    options.start_timeout = start_timeout_;
    auto coordinator = Coordinator::Open(options, &clock_, &metrics_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    c_ = std::move(*coordinator);
  }

  absl::Duration start_timeout_ = absl::Seconds(60);

  v1::Job Submit(int ranks = 1, int priority = 0, int max_restarts = 0) {
    auto job = c_->SubmitJob(SubmitRequest(ranks, priority, max_restarts));
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  std::shared_ptr<AssignmentQueue> Register(const std::string& name, int gpus,
                                            std::vector<v1::RankRef> running = {},
                                            v1::RegisterWorkerResponse* response = nullptr) {
    auto request = WorkerRequest(name, gpus);
    for (auto& ref : running) *request.add_running() = ref;
    auto registered = c_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (response != nullptr) *response = *registered;
    auto queue = c_->OpenAssignments(Assignments(name));
    EXPECT_TRUE(queue.ok()) << queue.status();
    return *queue;
  }

  static v1::StreamAssignmentsRequest Assignments(const std::string& worker,
                                                  const std::string& instance = "") {
    v1::StreamAssignmentsRequest request;
    request.set_worker_id(worker);
    request.set_instance(instance);
    return request;
  }

  static std::vector<v1::Assignment> Drain(const std::shared_ptr<AssignmentQueue>& queue) {
    std::vector<v1::Assignment> out;
    queue->Drain(&out, [] {});
    return out;
  }

  static v1::RankRef Ref(const std::string& job, int rank, int attempt) {
    v1::RankRef ref;
    ref.set_job_id(job);
    ref.set_rank(rank);
    ref.set_attempt(attempt);
    return ref;
  }

  void Report(const std::string& worker, v1::RankReport report) {
    v1::ReportStatusRequest request;
    request.set_worker_id(worker);
    *request.add_reports() = std::move(report);
    ASSERT_TRUE(c_->ReportStatus(request).ok());
  }
  void Started(const std::string& worker, const v1::RankRef& ref) {
    v1::RankReport report;
    *report.mutable_ref() = ref;
    report.set_started_pid(1234);
    Report(worker, report);
  }
  void Exited(const std::string& worker, const v1::RankRef& ref, int code) {
    v1::RankReport report;
    *report.mutable_ref() = ref;
    report.mutable_exited()->set_exit_code(code);
    Report(worker, report);
  }
  // The exit an agent reports for a rank it stopped on its way out (SIGTERM to hyscale-worker).
  void ExitedOnShutdown(const std::string& worker, const v1::RankRef& ref) {
    v1::RankReport report;
    *report.mutable_ref() = ref;
    report.mutable_exited()->set_exit_code(-1);
    report.mutable_exited()->set_signal(SIGTERM);
    report.mutable_exited()->set_reason("worker shutting down");
    report.mutable_exited()->set_worker_stopping(true);
    Report(worker, report);
  }
  void EventLine(const std::string& worker, const v1::RankRef& ref, const std::string& json) {
    v1::RankReport report;
    *report.mutable_ref() = ref;
    report.set_event_json(json);
    Report(worker, report);
  }
  void Log(const std::string& worker, const v1::RankRef& ref, const std::string& text) {
    v1::RankReport report;
    *report.mutable_ref() = ref;
    report.set_log(text);
    Report(worker, report);
  }
  void Heartbeat(const std::string& worker, std::vector<v1::RankRef> running,
                 v1::HeartbeatResponse* response = nullptr) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker);
    for (auto& ref : running) *request.add_running() = ref;
    auto result = c_->Heartbeat(request);
    ASSERT_TRUE(result.ok());
    if (response != nullptr) *response = *result;
  }

  // Rank 0's trainer publishing the store it serves.
  void Publish(const std::string& worker, const v1::RankRef& ref, const std::string& address) {
    EventLine(worker, ref,
              R"({"time":1,"rendezvous":{"address":")" + address + R"(","world_size":2}})");
  }
  // Advances the clock by `total` in 1 s steps, each followed by a heartbeat of every worker in
  // `running` (with the ranks it runs) and a Tick.
  void Pass(absl::Duration total, const std::map<std::string, std::vector<v1::RankRef>>& running) {
    for (absl::Duration left = total; left > absl::ZeroDuration(); left -= absl::Seconds(1)) {
      clock_.Advance(std::min(left, absl::Seconds(1)));
      for (const auto& [worker, refs] : running) Heartbeat(worker, refs);
      c_->Tick();
    }
  }

  v1::JobState State(const std::string& job_id) { return c_->GetJob(job_id)->state(); }

  // Whether the job's stored events include a JobReplanned.
  bool Replanned(const std::string& job_id) {
    const auto events = c_->JobEvents(job_id, 0, 1000);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() && std::any_of(events->begin(), events->end(),
                                      [](const v1::JobEvent& e) { return e.has_replanned(); });
  }

  std::vector<v1::JobEvent> Events(const std::string& job_id, int64_t after = 0) {
    std::vector<v1::JobEvent> events;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_sequence(after);
    // Only for terminal jobs: the watch ends by itself.
    EXPECT_TRUE(Watch(request, [&](const v1::JobEvent& e) {
                  events.push_back(e);
                  return true;
                }).ok());
    return events;
  }

  absl::Status Watch(const v1::WatchJobRequest& request,
                     const std::function<bool(const v1::JobEvent&)>& take) {
    auto stream = c_->WatchJob(request);
    if (!stream.ok()) return stream.status();
    return testing::DrainStream(**stream, take);
  }

  absl::Status Logs(const v1::StreamLogsRequest& request,
                    const std::function<bool(const v1::LogChunk&)>& take) {
    auto stream = c_->StreamLogs(request);
    if (!stream.ok()) return stream.status();
    return testing::DrainStream(**stream, take);
  }

  std::string dir_;
  FakeClock clock_;
  ServerMetrics metrics_{absl::Minutes(1)};
  std::unique_ptr<Coordinator> c_;
};

TEST_F(CoordinatorTest, JobRunsToSuccess) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(job.placement_size(), 1);
  EXPECT_EQ(job.placement(0).worker_id(), "w1");

  auto assignments = Drain(queue);
  ASSERT_EQ(assignments.size(), 1u);
  const v1::RunRank& run = assignments[0].run();
  EXPECT_EQ(run.ref().job_id(), job.id());
  EXPECT_EQ(run.ref().attempt(), 0);
  EXPECT_EQ(run.world_size(), 1);
  EXPECT_FALSE(run.resume());
  EXPECT_EQ(run.checkpoint_dir(), dir_ + "/checkpoints/" + job.id());
  EXPECT_EQ(run.rendezvous(), "");  // a single rank meets nobody
  EXPECT_EQ(run.spec().name(), "tiny");

  Started("w1", run.ref());
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  EventLine("w1", run.ref(),
            R"({"step":{"step":5,"total_steps":20,"loss":2.5,"tokens_per_second":100,)"
            R"("step_seconds":0.01,"phase_seconds":{"selection_fwd":0.002},)"
            R"("evaluation":{"accuracy":0.5,"indexer_recall":0.25}}})");
  EventLine("w1", run.ref(), R"({"checkpoint_written":{"step":5,"path":"/x"}})");
  EventLine("w1", run.ref(), "not json");  // ignored, the server keeps going
  auto running = c_->GetJob(job.id());
  EXPECT_EQ(running->progress().step(), 5);
  EXPECT_DOUBLE_EQ(running->progress().indexer_recall(), 0.25);
  EXPECT_TRUE(running->has_started_at());

  Exited("w1", run.ref(), 0);
  auto done = c_->GetJob(job.id());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(done->reason().empty());
  EXPECT_TRUE(done->has_finished_at());

  const auto events = Events(job.id());
  ASSERT_EQ(events.size(), 7u);
  EXPECT_EQ(events[0].sequence(), 0);  // the snapshot
  EXPECT_EQ(events[0].state_change().to(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(events[1].state_change().to(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(events[2].state_change().to(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(events[3].state_change().to(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(events[4].trainer().event().step().step(), 5);
  EXPECT_DOUBLE_EQ(events[4].trainer().event().step().phase_seconds().at("selection_fwd"), 0.002);
  EXPECT_EQ(events[5].trainer().event().checkpoint_written().path(), "/x");
  EXPECT_EQ(events[6].state_change().to(), v1::JOB_STATE_SUCCEEDED);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].sequence(), int64_t(i));
  EXPECT_EQ(Events(job.id(), 5).size(), 2u);  // snapshot + sequence 6
}

TEST_F(CoordinatorTest, SubmitValidationNamesTheField) {
  auto request = SubmitRequest();
  request.mutable_spec()->mutable_model()->set_d_model(-4);
  request.mutable_resources()->set_ranks(2000);
  request.set_priority(5000);
  auto job = c_->SubmitJob(request);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(job.status().message());
  EXPECT_NE(message.find("spec.model.d_model"), std::string::npos) << message;
  EXPECT_NE(message.find("resources.ranks"), std::string::npos) << message;
  EXPECT_NE(message.find("priority"), std::string::npos) << message;

  request = SubmitRequest();
  request.clear_spec();
  EXPECT_NE(std::string(c_->SubmitJob(request).status().message()).find("spec: required"),
            std::string::npos);
  request = SubmitRequest();
  request.mutable_resources()->set_memory_bytes_per_rank(-1);
  EXPECT_NE(std::string(c_->SubmitJob(request).status().message())
                .find("resources.memory_bytes_per_rank"),
            std::string::npos);
}

TEST_F(CoordinatorTest, SubmitIsIdempotentByRequestId) {
  auto request = SubmitRequest();
  request.set_request_id("req-1");
  auto first = c_->SubmitJob(request);
  auto second = c_->SubmitJob(request);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->id(), second->id());
  request.set_priority(7);
  EXPECT_EQ(c_->SubmitJob(request).status().code(), absl::StatusCode::kAlreadyExists);
  // Survives a restart of the coordinator.
  c_.reset();
  Open();
  request.set_priority(0);
  EXPECT_EQ(c_->SubmitJob(request)->id(), first->id());
  EXPECT_EQ(c_->ListJobs({})->jobs_size(), 1);
}

// Submissions from many clients at once share group commits; each is acknowledged only once it
// is stored, and all of them survive a restart.
TEST_F(CoordinatorTest, ConcurrentSubmissionsAreAllStored) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20;
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto request = SubmitRequest();
        request.set_request_id(absl::StrCat("req-", t, "-", i));
        if (!c_->SubmitJob(request).ok()) ++failed;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failed.load(), 0);
  c_.reset();
  Open();
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  EXPECT_EQ(c_->ListJobs(list)->jobs_size(), kThreads * kPerThread);
}

// A submission whose commit fails is refused and leaves nothing behind: the client's retry with
// the same request_id makes the job once.
TEST_F(CoordinatorTest, SubmissionThatCannotBeStoredIsForgotten) {
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/hyscale.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto request = SubmitRequest();
  request.set_request_id("req-1");
  const auto refused = c_->SubmitJob(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(c_->ListJobs({})->jobs_size(), 0);
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  const auto retried = c_->SubmitJob(request);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(c_->ListJobs({})->jobs_size(), 1);
  c_.reset();
  Open();
  EXPECT_EQ(c_->ListJobs({})->jobs_size(), 1);
}

TEST_F(CoordinatorTest, PendingUntilAWorkerFits) {
  const v1::Job job = Submit(2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("waiting for workers to join"), std::string::npos) << job.reason();
  Register("small", 1);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_PENDING);
  auto queue = Register("big", 2);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Drain(queue).size(), 1u);  // rank 0 first, to publish its rendezvous address
}

// Counts the coordinator's writes to the jobs table, through triggers another connection adds.
class JobWrites {
 public:
  explicit JobWrites(const std::string& db_path) {
    EXPECT_EQ(sqlite3_open(db_path.c_str(), &db_), SQLITE_OK);
    sqlite3_busy_timeout(db_, 5000);
    EXPECT_EQ(sqlite3_exec(db_,
                           "CREATE TABLE test_writes (kind TEXT);"
                           "CREATE TRIGGER test_insert AFTER INSERT ON jobs BEGIN "
                           "  INSERT INTO test_writes VALUES ('insert'); END;"
                           "CREATE TRIGGER test_update AFTER UPDATE ON jobs BEGIN "
                           "  INSERT INTO test_writes VALUES ('update'); END;",
                           nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(db_);
  }
  ~JobWrites() { sqlite3_close(db_); }
  JobWrites(const JobWrites&) = delete;
  JobWrites& operator=(const JobWrites&) = delete;

  int Count(const char* kind) {
    sqlite3_stmt* count = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, "SELECT count(*) FROM test_writes WHERE kind = ?", -1, &count,
                                 nullptr),
              SQLITE_OK);
    sqlite3_bind_text(count, 1, kind, -1, SQLITE_STATIC);
    EXPECT_EQ(sqlite3_step(count), SQLITE_ROW);
    const int n = sqlite3_column_int(count, 0);
    sqlite3_finalize(count);
    return n;
  }

 private:
  sqlite3* db_ = nullptr;
};

TEST_F(CoordinatorTest, WaitingSubmissionIsWrittenOnceWithItsReason) {
  Register("w1", 1);
  Submit(2);  // waits for workers, as the next one will
  JobWrites writes(dir_ + "/hyscale.db");
  const v1::Job job = Submit(2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("waiting for workers to join"), std::string::npos) << job.reason();
  EXPECT_EQ(writes.Count("insert"), 1);
  EXPECT_EQ(writes.Count("update"), 0);  // neither it nor the job before it is rewritten
  // Its PENDING event carries the real reason too.
  auto store = Store::Open(dir_ + "/hyscale.db");
  ASSERT_TRUE(store.ok());
  auto events = (*store)->LoadEvents(job.id(), 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ(events->at(0).state_change().reason(), job.reason());
}

TEST_F(CoordinatorTest, SubmitDecidesOnlyTheNewJobAndTickRefreshesReasonsOnce) {
  Register("w1", 2);
  const v1::Job running = Submit(1);
  EXPECT_EQ(State(running.id()), v1::JOB_STATE_SCHEDULED);
  const v1::Job waiting = Submit(2);
  EXPECT_NE(waiting.reason().find("1 of 2 matching are free"), std::string::npos)
      << waiting.reason();
  JobWrites writes(dir_ + "/hyscale.db");
  // Same priority: it may take the free slot the 2-rank job cannot use (skip-ahead).
  const v1::Job small = Submit(1);
  EXPECT_EQ(State(small.id()), v1::JOB_STATE_SCHEDULED);
  // No pass ran: only the new job was written (insert, then SCHEDULED).
  EXPECT_EQ(writes.Count("insert"), 1);
  EXPECT_EQ(writes.Count("update"), 1);
  EXPECT_EQ(c_->GetJob(waiting.id())->reason(), waiting.reason());
  // The next tick brings the waiting job's reason up to date, and later ticks write nothing.
  c_->Tick();
  EXPECT_NE(c_->GetJob(waiting.id())->reason().find("0 of 2 matching are free"), std::string::npos)
      << c_->GetJob(waiting.id())->reason();
  EXPECT_EQ(writes.Count("update"), 2);
  c_->Tick();
  c_->Tick();
  EXPECT_EQ(writes.Count("update"), 2);
}

TEST_F(CoordinatorTest, SubmitNeverSkipsAheadOfHigherPriority) {
  Register("w1", 2);
  const v1::Job running = Submit(1);
  const v1::Job head = Submit(2, 5);  // waits for the running job, holding back lower priorities
  EXPECT_EQ(State(head.id()), v1::JOB_STATE_PENDING);
  const v1::Job lower = Submit(1, 0);
  EXPECT_EQ(State(lower.id()), v1::JOB_STATE_PENDING);  // a slot is free, but not for it
  EXPECT_EQ(lower.reason(), "waiting behind a job of higher priority 5");
  const v1::Job higher = Submit(2, 9);  // now it holds back, the earlier head included
  EXPECT_EQ(State(higher.id()), v1::JOB_STATE_PENDING);
  c_->Tick();
  EXPECT_EQ(c_->GetJob(head.id())->reason(), "waiting behind a job of higher priority 9");
  EXPECT_EQ(c_->GetJob(lower.id())->reason(), "waiting behind a job of higher priority 9");
  // Capacity frees: a full pass places by priority, then FIFO.
  Exited("w1", Ref(running.id(), 0, 0), 0);
  EXPECT_EQ(State(higher.id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(State(head.id()), v1::JOB_STATE_PENDING);
  EXPECT_EQ(State(lower.id()), v1::JOB_STATE_PENDING);
  Exited("w1", Ref(higher.id(), 0, 0), 0);
  Exited("w1", Ref(higher.id(), 1, 0), 0);
  EXPECT_EQ(State(head.id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(State(lower.id()), v1::JOB_STATE_PENDING);
}

TEST_F(CoordinatorTest, CancelInEveryNonTerminalState) {
  EXPECT_EQ(c_->CancelJob("nope", "").status().code(), absl::StatusCode::kNotFound);
  const v1::Job pending = Submit();
  auto cancelled = c_->CancelJob(pending.id(), "changed my mind");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_NE(cancelled->reason().find("changed my mind"), std::string::npos);
  EXPECT_EQ(c_->CancelJob(pending.id(), "").status().code(), absl::StatusCode::kFailedPrecondition);

  auto queue = Register("w1", 1);
  const v1::Job running = Submit();
  const auto run = Drain(queue).at(0).run();
  Started("w1", run.ref());
  ASSERT_EQ(State(running.id()), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(c_->CancelJob(running.id(), "").ok());
  auto stops = Drain(queue);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().ref().job_id(), running.id());
  // The device stays busy until the worker stops running the rank.
  const v1::Job next = Submit();
  EXPECT_EQ(next.state(), v1::JOB_STATE_PENDING);
  v1::HeartbeatResponse beat;
  Heartbeat("w1", {run.ref()}, &beat);
  ASSERT_EQ(beat.stop_size(), 1);  // the stop is repeated until it happens
  Heartbeat("w1", {});
  EXPECT_EQ(State(next.id()), v1::JOB_STATE_SCHEDULED);
  // A late exit report of the cancelled job changes nothing.
  Exited("w1", run.ref(), 0);
  EXPECT_EQ(State(running.id()), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorTest, RestartsWithDoublingBackoffThenFails) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit(1, 0, /*max_restarts=*/2);
  auto run = Drain(queue).at(0).run();
  Started("w1", run.ref());
  Exited("w1", run.ref(), 1);
  auto restarting = c_->GetJob(job.id());
  EXPECT_EQ(restarting->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(restarting->restarts(), 1);
  EXPECT_NE(restarting->reason().find("exited with code 1"), std::string::npos);

  clock_.Advance(absl::Milliseconds(900));
  c_->Tick();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RESTARTING);  // backoff 1 s not over
  clock_.Advance(absl::Milliseconds(200));
  c_->Tick();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  run = Drain(queue).at(0).run();
  EXPECT_EQ(run.ref().attempt(), 1);
  EXPECT_TRUE(run.resume());

  // A report of the old attempt is ignored: the job does not end or run twice.
  Exited("w1", Ref(job.id(), 0, 0), 0);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);

  Started("w1", run.ref());
  v1::RankReport killed;
  *killed.mutable_ref() = run.ref();
  killed.mutable_exited()->set_exit_code(-1);
  killed.mutable_exited()->set_signal(9);
  killed.mutable_exited()->set_reason("killed by signal 9 (Killed)");
  Report("w1", killed);
  EXPECT_EQ(c_->GetJob(job.id())->reason(), "rank 0: killed by signal 9 (Killed) (restart 2 of 2)");
  EXPECT_EQ(c_->GetJob(job.id())->restarts(), 2);
  clock_.Advance(absl::Milliseconds(1500));
  c_->Tick();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RESTARTING);  // second backoff is 2 s
  clock_.Advance(absl::Milliseconds(600));
  c_->Tick();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  run = Drain(queue).at(0).run();
  EXPECT_EQ(run.ref().attempt(), 2);
  Exited("w1", run.ref(), -1);
  auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->reason().find("max_restarts 2 used up"), std::string::npos) << failed->reason();
}

TEST_F(CoordinatorTest, BadInputFailsWithoutRestart) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit(1, 0, 3);
  auto run = Drain(queue).at(0).run();
  Exited("w1", run.ref(), 2);
  auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->restarts(), 0);
  EXPECT_NE(failed->reason().find("bad input"), std::string::npos);
}

TEST_F(CoordinatorTest, OneRankFailingStopsTheOthers) {
  auto q1 = Register("w1", 1);
  auto q2 = Register("w2", 1);
  const v1::Job job = Submit(2, 0, 1);
  const v1::RankRef ref0 = Ref(job.id(), 0, 0);
  const v1::RankRef ref1 = Ref(job.id(), 1, 0);
  const std::string w0 = c_->GetJob(job.id())->placement(0).worker_id();
  const std::string w1 = c_->GetJob(job.id())->placement(1).worker_id();
  auto& q_rank0 = w0 == "w1" ? q1 : q2;
  Started(w0, ref0);
  Publish(w0, ref0, w0 + ".local:29400");
  ASSERT_EQ(Drain(q1).size() + Drain(q2).size(), 2u);
  Started(w1, ref1);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  Exited(w1, ref1, 1);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RESTARTING);
  auto stops = Drain(q_rank0);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().ref().rank(), 0);
  // Rank 0 still runs: the restart waits for its device.
  clock_.Advance(absl::Seconds(2));
  Heartbeat(w0, {ref0});
  Heartbeat(w1, {});
  c_->Tick();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RESTARTING);
  Heartbeat(w0, {});
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(c_->GetJob(job.id())->restarts(), 1);
}

// Rank 0 of a context-parallel job goes first, with port 0; the address it publishes is stored
// with the job and only then are the other ranks sent, with it.
TEST_F(CoordinatorTest, ContextParallelJobStartsRankZeroFirst) {
  auto q1 = Register("w1", 1);
  auto q2 = Register("w2", 1);
  const v1::Job job = Submit(2);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.rendezvous(), "");
  const std::string w0 = job.placement(0).worker_id();
  const std::string w1 = job.placement(1).worker_id();
  ASSERT_NE(w0, w1);
  auto& q_rank0 = w0 == "w1" ? q1 : q2;
  auto& q_rank1 = w0 == "w1" ? q2 : q1;
  auto first = Drain(q_rank0);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(Drain(q_rank1).empty());
  const v1::RunRank& run0 = first[0].run();
  EXPECT_EQ(run0.ref().rank(), 0);
  EXPECT_EQ(run0.world_size(), 2);
  EXPECT_EQ(run0.rendezvous(), w0 + ".local:0");

  Started(w0, run0.ref());
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);  // rank 1 has not started
  // Rank 1 publishes nothing, and an address without a real port is no address.
  Publish(w1, Ref(job.id(), 1, 0), "w1.local:1234");
  Publish(w0, run0.ref(), w0 + ".local:0");
  EXPECT_TRUE(Drain(q_rank1).empty());
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), "");

  Publish(w0, run0.ref(), w0 + ".local:29400");
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), w0 + ".local:29400");
  auto second = Drain(q_rank1);
  ASSERT_EQ(second.size(), 1u);
  const v1::RunRank& run1 = second[0].run();
  EXPECT_EQ(run1.ref().rank(), 1);
  EXPECT_EQ(run1.world_size(), 2);
  EXPECT_EQ(run1.rendezvous(), w0 + ".local:29400");
  EXPECT_TRUE(Drain(q_rank0).empty());

  // A second publication changes nothing: the ranks already have the first.
  Publish(w0, run0.ref(), w0 + ".local:29401");
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), w0 + ".local:29400");
  EXPECT_TRUE(Drain(q_rank0).empty());
  EXPECT_TRUE(Drain(q_rank1).empty());
  // A reopened stream resends rank 1 (not running yet), never rank 0 (it has run).
  q_rank0 = *c_->OpenAssignments(Assignments(w0));
  q_rank1 = *c_->OpenAssignments(Assignments(w1));
  EXPECT_TRUE(Drain(q_rank0).empty());
  ASSERT_EQ(Drain(q_rank1).at(0).run().rendezvous(), w0 + ".local:29400");

  Started(w1, run1.ref());
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  Exited(w0, run0.ref(), 0);
  Exited(w1, run1.ref(), 0);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SUCCEEDED);
  int published = 0;
  for (const auto& event : Events(job.id())) {
    if (event.trainer().event().has_rendezvous()) ++published;
  }
  EXPECT_EQ(published, 4);  // every line is in the job's events, whatever it did
}

// The coordinator dies after storing rank 0's address, before rank 1 got its RunRank: once the
// workers are back, rank 1 is sent the stored address and rank 0 keeps running.
TEST_F(CoordinatorTest, PublishedAddressSurvivesCoordinatorRestart) {
  auto q1 = Register("w1", 1);
  auto q2 = Register("w2", 1);
  const v1::Job job = Submit(2);
  const std::string w0 = job.placement(0).worker_id();
  const std::string w1 = job.placement(1).worker_id();
  const v1::RankRef ref0 = Ref(job.id(), 0, 0);
  Started(w0, ref0);
  Publish(w0, ref0, "10.0.0.7:29400");

  c_.reset();                          // rank 1's RunRank is lost with the queues
  start_timeout_ = absl::Minutes(10);  // rank 1 stays unstarted past the rendezvous timeout
  Open();
  auto reloaded = c_->GetJob(job.id());
  EXPECT_EQ(reloaded->state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(reloaded->rendezvous(), "10.0.0.7:29400");
  auto q_rank0 = Register(w0, 1, {ref0});
  auto q_rank1 = Register(w1, 1);
  EXPECT_TRUE(Drain(q_rank0).empty());
  auto resent = Drain(q_rank1);
  ASSERT_EQ(resent.size(), 1u);
  EXPECT_EQ(resent[0].run().ref().rank(), 1);
  EXPECT_EQ(resent[0].run().rendezvous(), "10.0.0.7:29400");
  // Long past the rendezvous timeout: the address is in, nothing expires.
  Pass(absl::Seconds(200), {{w0, {ref0}}, {w1, {}}});
  Started(w1, resent[0].run().ref());
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(c_->GetJob(job.id())->restarts(), 0);
}

// After a coordinator restart, a rank 0 that had published but is gone when its worker returns
// fails the attempt: a new rank 0 would serve a store rank 1 never hears of.
TEST_F(CoordinatorTest, PublishedRankZeroMissingAfterCoordinatorRestartFailsTheAttempt) {
  Register("w1", 2);
  const v1::Job job = Submit(2, 0, 1);
  const v1::RankRef ref0 = Ref(job.id(), 0, 0);
  Started("w1", ref0);
  Publish("w1", ref0, "w1.local:29400");
  c_.reset();
  Open();
  auto queue = Register("w1", 2);
  auto restarting = c_->GetJob(job.id());
  EXPECT_EQ(restarting->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(restarting->reason().find("rank 0 is no longer running"), std::string::npos)
      << restarting->reason();
  EXPECT_EQ(restarting->rendezvous(), "");
  EXPECT_TRUE(Drain(queue).empty());
}

// No address within the timeout (120 s by default) fails the attempt like a failed rank: a
// restart while restarts remain, then FAILED. Each attempt publishes afresh; an older attempt's
// publication is ignored.
TEST_F(CoordinatorTest, RendezvousTimeoutRestartsThenFails) {
  auto queue = Register("w1", 2);
  const v1::Job job = Submit(2, 0, /*max_restarts=*/1);
  auto run0 = Drain(queue).at(0).run();
  ASSERT_EQ(run0.ref().rank(), 0);
  Started("w1", run0.ref());
  Pass(absl::Seconds(119), {{"w1", {run0.ref()}}});
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  Pass(absl::Seconds(1), {{"w1", {run0.ref()}}});
  auto restarting = c_->GetJob(job.id());
  EXPECT_EQ(restarting->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(restarting->reason(),
            "rank 0 did not publish its rendezvous address within 120 s (restart 1 of 1)");
  auto stops = Drain(queue);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().ref().rank(), 0);

  // Once the old rank 0 is gone and the backoff is over, the new attempt starts with rank 0.
  Pass(absl::Seconds(2), {{"w1", {}}});
  ASSERT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  auto sent = Drain(queue);
  ASSERT_EQ(sent.size(), 1u);
  run0 = sent[0].run();
  EXPECT_EQ(run0.ref().rank(), 0);
  EXPECT_EQ(run0.ref().attempt(), 1);
  EXPECT_EQ(run0.rendezvous(), "w1.local:0");
  // The first attempt's rank 0, late: ignored.
  Publish("w1", Ref(job.id(), 0, 0), "w1.local:29400");
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), "");
  EXPECT_TRUE(Drain(queue).empty());

  Started("w1", run0.ref());
  Pass(absl::Seconds(120), {{"w1", {run0.ref()}}});
  auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->reason(),
            "rank 0 did not publish its rendezvous address within 120 s (max_restarts 1 used up)");
}

// A restart clears the address; the next attempt's rank 0 publishes its own, which the other
// ranks get. A coordinator restart before it publishes restarts the timeout (plus the grace).
TEST_F(CoordinatorTest, RestartClearsTheAddress) {
  auto queue = Register("w1", 2);
  const v1::Job job = Submit(2, 0, /*max_restarts=*/1);
  const v1::RankRef ref0 = Ref(job.id(), 0, 0);
  const v1::RankRef ref1 = Ref(job.id(), 1, 0);
  Started("w1", ref0);
  Publish("w1", ref0, "w1.local:29400");
  Started("w1", ref1);
  ASSERT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  Exited("w1", ref1, 1);
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), "");
  Pass(absl::Seconds(2), {{"w1", {}}});
  ASSERT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  queue = Register("w1", 2);  // drops what was queued before
  auto sent = Drain(queue);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].run().ref().attempt(), 1);
  EXPECT_EQ(sent[0].run().ref().rank(), 0);

  c_.reset();
  Open();
  queue = Register("w1", 2, {Ref(job.id(), 0, 1)});
  EXPECT_TRUE(Drain(queue).empty());
  // 120 s + the 5 s recovery grace from the reload.
  Pass(absl::Seconds(124), {{"w1", {Ref(job.id(), 0, 1)}}});
  ASSERT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  Publish("w1", Ref(job.id(), 0, 1), "w1.local:29411");
  sent = Drain(queue);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].run().ref().rank(), 1);
  EXPECT_EQ(sent[0].run().ref().attempt(), 1);
  EXPECT_EQ(sent[0].run().rendezvous(), "w1.local:29411");
  EXPECT_TRUE(sent[0].run().resume());
}

// The address goes to the other ranks only once it is stored: a publication the store refuses
// sends nothing, and the agent's second try publishes it.
TEST_F(CoordinatorTest, AddressIsSentOnlyOnceStored) {
  auto queue = Register("w1", 2);
  const v1::Job job = Submit(2);
  const v1::RankRef ref0 = Ref(job.id(), 0, 0);
  ASSERT_EQ(Drain(queue).size(), 1u);
  Started("w1", ref0);
  v1::ReportStatusRequest request;
  request.set_worker_id("w1");
  *request.add_reports()->mutable_ref() = ref0;
  request.mutable_reports(0)->set_event_json(
      R"({"time":1,"rendezvous":{"address":"w1.local:29400","world_size":2}})");
  // Another connection holds the write lock past the store's busy timeout.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/hyscale.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(c_->ReportStatus(request).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Drain(queue).empty());
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), "");
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  ASSERT_TRUE(c_->ReportStatus(request).ok());
  auto sent = Drain(queue);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].run().ref().rank(), 1);
  EXPECT_EQ(sent[0].run().rendezvous(), "w1.local:29400");
  EXPECT_EQ(c_->GetJob(job.id())->rendezvous(), "w1.local:29400");
}

TEST(TrainerEventsTest, RendezvousAddressNeedsHostAndRealPort) {
  const auto address = [](const std::string& value) {
    v1::TrainerEventLine::Rendezvous rendezvous;
    rendezvous.set_address(value);
    return RendezvousAddress(rendezvous);
  };
  EXPECT_EQ(*address("10.0.0.7:29400"), "10.0.0.7:29400");
  EXPECT_EQ(*address("w1.local:1"), "w1.local:1");
  for (const std::string& bad :
       std::vector<std::string>{"w1.local:0", "w1.local", ":29400", "w1.local:65536", "w1.local:-5",
                                "w1.local:x", "w1.local:", std::string(400, 'h')}) {
    EXPECT_EQ(address(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(TrainerEventsTest, StepCarriesContextParallelCommunication) {
  const auto cp =
      ParseTrainerEvent(0, R"({"step":{"step":3,"comm":{"exposed":0.25,"overlapped":0.5}}})");
  ASSERT_TRUE(cp.ok()) << cp.status();
  EXPECT_DOUBLE_EQ(cp->trainer().event().step().comm().exposed(), 0.25);
  EXPECT_DOUBLE_EQ(cp->trainer().event().step().comm().overlapped(), 0.5);
  const auto alone = ParseTrainerEvent(1, R"({"step":{"step":3}})");
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->trainer().rank(), 1);
  EXPECT_FALSE(alone->trainer().event().step().has_comm());
  EXPECT_FALSE(ParseTrainerEvent(0, R"({"step":{"comm":{"exposed":"x"}}})").ok());
  // Integers that do not fit (a float past int64, a negative count) are refused, not converted.
  EXPECT_FALSE(ParseTrainerEvent(0, R"({"step":{"step":488888888888888888888888888}})").ok());
  EXPECT_FALSE(ParseTrainerEvent(0, R"({"step":{"step":2.5}})").ok());
  EXPECT_FALSE(ParseTrainerEvent(0, R"({"step":{"peak_memory_bytes":-1}})").ok());
  EXPECT_FALSE(ParseTrainerEvent(0, R"({"step":{"stage":4294967296}})").ok());
}

// A worker name is a lease: another agent cannot take a live worker's identity (and its ranks);
// the agent holding it may register again (a reconnect), and once it is lost anyone may.
TEST_F(CoordinatorTest, WorkerNamesAreLeases) {
  auto first = WorkerRequest("w1", 1);
  first.set_instance("agent-a");
  ASSERT_TRUE(c_->RegisterWorker(first).ok());
  auto second = WorkerRequest("w1", 1);
  second.set_instance("agent-b");
  const auto refused = c_->RegisterWorker(second);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("held by another live agent"), std::string::npos);
  // Nor can it act as the worker without registering.
  v1::HeartbeatRequest beat;
  beat.set_worker_id("w1");
  beat.set_instance("agent-b");
  EXPECT_FALSE(c_->Heartbeat(beat)->registered());
  v1::ReportStatusRequest report;
  report.set_worker_id("w1");
  report.set_instance("agent-b");
  EXPECT_TRUE(absl::IsFailedPrecondition(c_->ReportStatus(report)));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(c_->OpenAssignments(Assignments("w1", "agent-b")).status()));
  beat.set_instance("agent-a");
  EXPECT_TRUE(c_->Heartbeat(beat)->registered());
  EXPECT_TRUE(c_->RegisterWorker(first).ok());  // the holder reconnecting
  clock_.Advance(absl::Seconds(4));             // silent for 4 s > 3 s: lost
  c_->Tick();
  ASSERT_EQ(c_->ListWorkers({})->workers(0).state(), v1::WORKER_STATE_LOST);
  EXPECT_TRUE(c_->RegisterWorker(second).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(c_->RegisterWorker(first).status()));
}

// The lease survives a coordinator restart: until the worker is declared lost, only the agent
// that held the name takes it back (nobody may slip in while agents reconnect).
TEST_F(CoordinatorTest, WorkerLeaseSurvivesARestart) {
  auto first = WorkerRequest("w1", 1);
  first.set_instance("agent-a");
  ASSERT_TRUE(c_->RegisterWorker(first).ok());
  c_.reset();
  Open();
  auto second = WorkerRequest("w1", 1);
  second.set_instance("agent-b");
  EXPECT_TRUE(absl::IsFailedPrecondition(c_->RegisterWorker(second).status()));
  v1::HeartbeatRequest beat;
  beat.set_worker_id("w1");
  beat.set_instance("agent-b");
  EXPECT_FALSE(c_->Heartbeat(beat)->registered());
  EXPECT_TRUE(c_->RegisterWorker(first).ok());
}

// An agent that stops cleanly says so in its last heartbeat: the worker is lost at once, so its
// name is free for the next agent and its jobs restart without waiting for the heartbeat timeout.
// While it still reports a running rank, leaving is not taken.
TEST_F(CoordinatorTest, AWorkerThatLeavesFreesItsNameAtOnce) {
  auto first = WorkerRequest("w1", 1);
  first.set_instance("agent-a");
  ASSERT_TRUE(c_->RegisterWorker(first).ok());
  const v1::Job job = Submit(1, 0, 1);
  ASSERT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  v1::HeartbeatRequest beat;
  beat.set_worker_id("w1");
  beat.set_instance("agent-a");
  beat.set_leaving(true);
  *beat.add_running() = Ref(job.id(), 0, 0);
  ASSERT_TRUE(c_->Heartbeat(beat)->registered());
  EXPECT_EQ(c_->ListWorkers({})->workers(0).state(), v1::WORKER_STATE_ONLINE);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  beat.clear_running();
  ASSERT_TRUE(c_->Heartbeat(beat)->registered());
  EXPECT_EQ(c_->ListWorkers({})->workers(0).state(), v1::WORKER_STATE_LOST);
  const auto restarting = c_->GetJob(job.id());
  EXPECT_EQ(restarting->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(restarting->reason().find("worker w1 left: its agent stopped"), std::string::npos)
      << restarting->reason();
  auto second = WorkerRequest("w1", 1);
  second.set_instance("agent-b");
  EXPECT_TRUE(c_->RegisterWorker(second).ok());  // at once: no lease to wait out
}

// A worker restored from the store takes no new ranks until its agent is heard from. Its agent
// may have stopped while the coordinator was down (`hyscale up` run again: the old agent stopped
// cleanly, a new one wants the name): a rank placed there would wait out the lease and fail with
// it.
TEST_F(CoordinatorTest, RestoredWorkersTakeNewRanksOnlyOnceHeardFrom) {
  auto first = WorkerRequest("w1", 2);  // room for both jobs
  first.set_instance("agent-a");
  ASSERT_TRUE(c_->RegisterWorker(first).ok());
  c_.reset();
  Open();
  const v1::Job job = Submit();  // max_restarts 0
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_PENDING);
  auto second = WorkerRequest("w1", 2);
  second.set_instance("agent-b");
  EXPECT_TRUE(absl::IsFailedPrecondition(c_->RegisterWorker(second).status()));
  clock_.Advance(absl::Seconds(9));  // recovery grace 5 s + heartbeat timeout 3 s: w1 is lost
  c_->Tick();
  ASSERT_EQ(c_->ListWorkers({})->workers(0).state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_PENDING);  // it waited, rather than fail with w1
  ASSERT_TRUE(c_->RegisterWorker(second).ok());
  auto queue = c_->OpenAssignments(Assignments("w1", "agent-b"));
  ASSERT_TRUE(queue.ok()) << queue.status();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Drain(*queue).size(), 1u);

  // The agent that held the name, heard from again after a restart, takes new ranks at once.
  c_.reset();
  Open();
  const v1::Job next = Submit();
  EXPECT_EQ(State(next.id()), v1::JOB_STATE_PENDING);
  v1::HeartbeatRequest beat;
  beat.set_worker_id("w1");
  beat.set_instance("agent-b");
  ASSERT_TRUE(c_->Heartbeat(beat)->registered());
  EXPECT_EQ(State(next.id()), v1::JOB_STATE_SCHEDULED);
}

// A rank its agent stopped on a clean shutdown (a drained node, a replaced pod) ends the attempt
// without using a restart: the job (max_restarts 0) runs again elsewhere instead of failing.
TEST_F(CoordinatorTest, ARankItsWorkerStoppedOnShutdownUsesNoRestart) {
  auto q1 = Register("w1", 1);
  const v1::Job job = Submit();
  const v1::RankRef ref = Drain(q1).at(0).run().ref();
  Started("w1", ref);
  ExitedOnShutdown("w1", ref);
  auto restarted = c_->GetJob(job.id());
  EXPECT_EQ(restarted->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(restarted->restarts(), 1);
  EXPECT_EQ(restarted->disruptions(), 1);
  EXPECT_NE(restarted->reason().find("worker shutting down"), std::string::npos);
  EXPECT_NE(restarted->reason().find("(placed again; not counted against max_restarts)"),
            std::string::npos)
      << restarted->reason();
  // A failure of the rank itself counts.
  auto q2 = Register("w2", 1);
  Pass(absl::Seconds(2), {{"w1", {}}, {"w2", {}}});
  std::vector<v1::Assignment> sent = Drain(q1);
  for (auto& assignment : Drain(q2)) sent.push_back(assignment);
  ASSERT_EQ(sent.size(), 1u);
  const v1::RankRef again = sent[0].run().ref();
  EXPECT_EQ(again.attempt(), 1);
  const std::string worker = c_->GetJob(job.id())->placement(0).worker_id();
  Started(worker, again);
  Exited(worker, again, -1);
  auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->reason().find("(max_restarts is 0)"), std::string::npos) << failed->reason();
}

// A worker lost (no heartbeat) before the rank placed on it started did not fail the job either;
// one lost while the rank ran might have (a trainer that takes its node down), and counts.
TEST_F(CoordinatorTest, AWorkerLostBeforeItsRankStartedUsesNoRestart) {
  auto q1 = Register("w1", 1);
  const v1::Job job = Submit();
  ASSERT_EQ(Drain(q1).size(), 1u);   // sent, never started
  clock_.Advance(absl::Seconds(4));  // past the 3 s heartbeat timeout
  c_->Tick();
  auto restarted = c_->GetJob(job.id());
  EXPECT_EQ(restarted->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(restarted->disruptions(), 1);
  EXPECT_EQ(restarted->reason(),
            "worker w1 lost: no heartbeat for 3000 ms (placed again; not counted against "
            "max_restarts)");
}

// Attempts that end without counting are bounded: a worker that keeps taking the job and leaving
// cannot restart it forever. After ten, the next one counts (max_restarts 0: the job fails).
TEST_F(CoordinatorTest, AttemptsEndedWithoutCountingAreBounded) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  for (int attempt = 0; attempt <= 10; ++attempt) {
    Heartbeat("w1", {});
    const std::vector<v1::Assignment> sent = Drain(queue);
    ASSERT_EQ(sent.size(), 1u) << "attempt " << attempt;
    const v1::RankRef ref = sent[0].run().ref();
    ASSERT_EQ(ref.attempt(), attempt);
    Started("w1", ref);
    ExitedOnShutdown("w1", ref);
    if (attempt < 10) {
      ASSERT_EQ(State(job.id()), v1::JOB_STATE_RESTARTING) << "attempt " << attempt;
      clock_.Advance(absl::Minutes(20));  // past the backoff (up to 2^10 s)
      Heartbeat("w1", {});
      c_->Tick();
    }
  }
  auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->disruptions(), 10);
  EXPECT_EQ(failed->reason(),
            "rank 0 was killed by signal 15: worker shutting down; counted: 10 attempts already "
            "ended without counting (max_restarts is 0)");
}

// A worker that heartbeats but never starts what it is given: after the start timeout (60 s) the
// job goes elsewhere, without using its restarts (max_restarts 0 here), and the worker gets no
// placements until its exclusion (10 min) ends.
TEST_F(CoordinatorTest, RankThatNeverStartsMovesAndExcludesItsWorker) {
  auto q1 = Register("w1", 1);
  const v1::Job job = Submit();
  ASSERT_EQ(Drain(q1).size(), 1u);  // placed on w1, which never reports it started
  auto q2 = Register("w2", 1);
  Pass(absl::Seconds(59), {{"w1", {}}, {"w2", {}}});
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  Pass(absl::Seconds(1), {{"w1", {}}, {"w2", {}}});
  auto restarted = c_->GetJob(job.id());
  EXPECT_EQ(restarted->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(restarted->restarts(), 1);  // the attempt number
  EXPECT_EQ(restarted->start_timeouts(), 1);
  EXPECT_EQ(restarted->reason(),
            "rank 0 did not report its start on worker w1 within 1m (placed again; not counted "
            "against max_restarts)");
  const auto workers = *c_->ListWorkers({});
  ASSERT_EQ(workers.workers(0).id(), "w1");
  EXPECT_TRUE(workers.workers(0).has_unhealthy_until());
  EXPECT_EQ(workers.workers(0).state(), v1::WORKER_STATE_ONLINE);
  Pass(absl::Seconds(2), {{"w1", {}}, {"w2", {}}});
  auto placed = c_->GetJob(job.id());
  ASSERT_EQ(placed->placement_size(), 1);
  EXPECT_EQ(placed->placement(0).worker_id(), "w2");
  Started("w2", Drain(q2).at(0).run().ref());
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  // Excluded: a new job waits rather than go to w1, until the exclusion ends.
  const v1::Job waiting = Submit();
  Pass(absl::Minutes(9), {{"w1", {}}, {"w2", {Ref(job.id(), 0, 1)}}});
  EXPECT_EQ(State(waiting.id()), v1::JOB_STATE_PENDING);
  Pass(absl::Minutes(1), {{"w1", {}}, {"w2", {Ref(job.id(), 0, 1)}}});
  EXPECT_EQ(State(waiting.id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_FALSE(c_->ListWorkers({})->workers(0).has_unhealthy_until());
}

// A job its devices cannot hold is refused at submission (the planner says why); one that fits the
// profile is placed only where its estimated memory fits, and otherwise waits, saying so.
TEST_F(CoordinatorTest, JobsThatCannotFitAreRefusedOrWait) {
  auto huge = SubmitRequest(1, 0, 2);
  huge.mutable_spec()->mutable_model()->set_vocab_size(1 << 24);
  huge.mutable_spec()->mutable_data()->set_seq_len(65536);
  const auto refused = c_->SubmitJob(huge);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("spec: does not fit 1 "), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("device(s): memory"), std::string::npos);
  // Each stage counts on its own: at 64K tokens the sparse stage fits, the dense one before it
  // (its score tables without recomputation) does not.
  auto staged = SubmitRequest(1, 0, 2);
  staged.mutable_spec()->mutable_data()->set_seq_len(65536);
  v1::StageSpec* dense = staged.mutable_spec()->mutable_stages(0);
  dense->set_name("dense");
  dense->set_attention(v1::DENSE);
  v1::StageSpec* sparse = staged.mutable_spec()->add_stages();
  *sparse = staged.spec().stages(0);
  sparse->set_name("sparse");
  sparse->set_attention(v1::SPARSE);
  const auto refused_stage = c_->SubmitJob(staged);
  EXPECT_TRUE(absl::IsInvalidArgument(refused_stage.status())) << refused_stage.status();
  EXPECT_NE(refused_stage.status().message().find("device(s): stage 'dense': memory"),
            std::string::npos)
      << refused_stage.status();
  staged.mutable_spec()->mutable_stages()->DeleteSubrange(0, 1);
  EXPECT_TRUE(c_->SubmitJob(staged).ok());

  auto small = WorkerRequest("small", 1);
  small.mutable_devices(0)->set_memory_bytes(1000);
  ASSERT_TRUE(c_->RegisterWorker(small).ok());
  const v1::Job job = Submit();
  EXPECT_GT(job.resources().memory_bytes_per_rank(), 1000);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("bytes each"), std::string::npos) << job.reason();
}

// Out of memory fails the same way on every attempt: the job fails without a restart.
TEST_F(CoordinatorTest, OutOfMemoryIsNotRestarted) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit(1, 0, 2);
  const v1::RankRef ref = Drain(queue).at(0).run().ref();
  Started("w1", ref);
  Exited("w1", ref, kExitOutOfMemory);
  const auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->restarts(), 0);
  EXPECT_NE(failed->reason().find("out of memory"), std::string::npos) << failed->reason();
}

TEST_F(CoordinatorTest, LostWorkerRestartsItsJobsElsewhere) {
  auto q1 = Register("w1", 1);
  const v1::Job job = Submit(1, 0, 1);
  Started("w1", Drain(q1).at(0).run().ref());
  auto q2 = Register("w2", 1);
  clock_.Advance(absl::Seconds(2));
  Heartbeat("w2", {});
  clock_.Advance(absl::Seconds(2));  // w1 silent for 4 s > 3 s
  Heartbeat("w2", {});
  c_->Tick();
  EXPECT_EQ(c_->ListWorkers({})->workers(0).state(), v1::WORKER_STATE_LOST);
  auto restarting = c_->GetJob(job.id());
  EXPECT_EQ(restarting->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(restarting->reason().find("worker w1 lost"), std::string::npos);
  clock_.Advance(absl::Seconds(1));
  Heartbeat("w2", {});
  c_->Tick();
  auto placed = c_->GetJob(job.id());
  EXPECT_EQ(placed->state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(placed->placement(0).worker_id(), "w2");
  EXPECT_EQ(Drain(q2).at(0).run().ref().attempt(), 1);
  // The lost worker must register again; it is then told to stop its stale rank.
  v1::HeartbeatResponse beat;
  Heartbeat("w1", {}, &beat);
  EXPECT_FALSE(beat.registered());
  v1::RegisterWorkerResponse registered;
  Register("w1", 1, {Ref(job.id(), 0, 0)}, &registered);
  ASSERT_EQ(registered.stop_size(), 1);
  EXPECT_EQ(registered.stop(0).attempt(), 0);
}

TEST_F(CoordinatorTest, RecoversAfterCoordinatorRestart) {
  auto queue = Register("w1", 2);
  const v1::Job kept = Submit();
  const v1::Job vanished = Submit(1, 0, 1);
  for (const auto& a : Drain(queue)) Started("w1", a.run().ref());
  const v1::Job pending = Submit(4);
  ASSERT_EQ(State(kept.id()), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(State(vanished.id()), v1::JOB_STATE_RUNNING);

  c_.reset();
  Open();
  EXPECT_EQ(State(kept.id()), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(State(pending.id()), v1::JOB_STATE_PENDING);
  // w1 comes back running only `kept`: `vanished` exited while nobody listened.
  v1::RegisterWorkerResponse registered;
  queue = Register("w1", 2, {Ref(kept.id(), 0, 0)}, &registered);
  EXPECT_EQ(registered.stop_size(), 0);
  EXPECT_EQ(State(kept.id()), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(State(vanished.id()), v1::JOB_STATE_RESTARTING);
  EXPECT_TRUE(Drain(queue).empty());  // kept runs; nothing to resend
  Exited("w1", Ref(kept.id(), 0, 0), 0);
  EXPECT_EQ(State(kept.id()), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, WorkerThatNeverReturnsAfterRestartIsLost) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit(1, 0, 0);
  Started("w1", Drain(queue).at(0).run().ref());
  c_.reset();
  Open();
  clock_.Advance(absl::Seconds(7));
  c_->Tick();
  // Within heartbeat timeout (3 s) + recovery grace (5 s).
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(2));
  c_->Tick();
  auto failed = c_->GetJob(job.id());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);  // max_restarts 0
  EXPECT_NE(failed->reason().find("lost"), std::string::npos);
}

// A report batch is stored whole or not at all, and so applied: when a later report of the batch
// cannot be written, the changes of the earlier ones are undone too, and the agent's resend
// applies them all (before, the job stayed SUCCEEDED in memory while the store had it SCHEDULED,
// and the resend was ignored).
TEST_F(CoordinatorTest, ReportBatchThatIsNotStoredLeavesNoChange) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  const auto ref = Drain(queue).at(0).run().ref();
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/hyscale.db").c_str(), &other), SQLITE_OK);
  // The SUCCEEDED transition's event cannot be written; RUNNING's can.
  ASSERT_EQ(sqlite3_exec(other,
                         "CREATE TRIGGER refuse_success BEFORE INSERT ON job_events "
                         "WHEN NEW.sequence = 4 BEGIN SELECT RAISE(ABORT, 'injected'); END;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(other);
  v1::ReportStatusRequest request;
  request.set_worker_id("w1");
  auto* started = request.add_reports();
  *started->mutable_ref() = ref;
  started->set_started_pid(4242);
  auto* exited = request.add_reports();
  *exited->mutable_ref() = ref;
  exited->mutable_exited()->set_exit_code(0);
  EXPECT_EQ(c_->ReportStatus(request).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(sqlite3_exec(other, "DROP TRIGGER refuse_success", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(other);
  ASSERT_TRUE(c_->ReportStatus(request).ok());  // the agent sends it again
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SUCCEEDED);
  c_.reset();
  Open();
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, ReportThatCannotBeStoredIsRefusedAndRetried) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  const auto ref = Drain(queue).at(0).run().ref();
  Started("w1", ref);
  // Another connection holds the write lock past the store's busy timeout.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/hyscale.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  v1::ReportStatusRequest request;
  request.set_worker_id("w1");
  auto* exited = request.add_reports();
  *exited->mutable_ref() = ref;
  exited->mutable_exited()->set_exit_code(0);
  const auto status = c_->ReportStatus(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);  // nothing applied that is not stored
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  ASSERT_TRUE(c_->ReportStatus(request).ok());  // the agent sends it again
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, JobOnAnUnknownWorkerIsRestartedOnLoad) {
  c_.reset();
  {
    auto store = Store::Open(dir_ + "/hyscale.db");
    ASSERT_TRUE(store.ok());
    v1::Job job;
    job.set_id("job-orphan");
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_max_restarts(1);
    job.mutable_resources()->set_ranks(1);
    auto* placement = job.add_placement();
    placement->set_worker_id("w9");
    ASSERT_TRUE((*store)->InsertJob(job, {}).ok());
  }
  Open();
  auto job = c_->GetJob("job-orphan");
  EXPECT_EQ(job->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(job->reason().find("worker w9 is not registered"), std::string::npos);
}

TEST_F(CoordinatorTest, ReopenedStreamResendsRanksNotRunning) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  ASSERT_EQ(Drain(queue).size(), 1u);  // delivered, but the agent never started it
  queue = *c_->OpenAssignments(Assignments("w1"));
  auto resent = Drain(queue);
  ASSERT_EQ(resent.size(), 1u);
  EXPECT_EQ(resent[0].run().ref().job_id(), job.id());
  Heartbeat("w1", {resent[0].run().ref()});
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_RUNNING);  // the heartbeat shows it started
  queue = *c_->OpenAssignments(Assignments("w1"));
  EXPECT_TRUE(Drain(queue).empty());
  EXPECT_EQ(c_->OpenAssignments(Assignments("ghost")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, RegisterWorkerValidates) {
  auto request = WorkerRequest("", 1);
  EXPECT_EQ(c_->RegisterWorker(request).status().message(), "name: required");
  request = WorkerRequest("w", 0);
  EXPECT_NE(std::string(c_->RegisterWorker(request).status().message()).find("devices[0].count"),
            std::string::npos);
  request = WorkerRequest("w", 1000);
  for (int i = 0; i < 4; ++i) *request.add_devices() = request.devices(0);
  EXPECT_NE(std::string(c_->RegisterWorker(request).status().message()).find("at most 4096"),
            std::string::npos);
  request = WorkerRequest("w", 1);
  request.mutable_devices(0)->set_kind(v1::DEVICE_KIND_UNSPECIFIED);
  EXPECT_EQ(c_->RegisterWorker(request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c_->ListWorkers({})->workers().empty());
}

TEST_F(CoordinatorTest, HeartbeatStopsUnwantedRanks) {
  v1::HeartbeatResponse beat;
  Heartbeat("ghost", {}, &beat);
  EXPECT_FALSE(beat.registered());
  Register("w1", 1);
  Heartbeat("w1", {Ref("job-unknown", 0, 0)}, &beat);
  EXPECT_TRUE(beat.registered());
  ASSERT_EQ(beat.stop_size(), 1);
  EXPECT_EQ(beat.stop(0).job_id(), "job-unknown");
}

TEST_F(CoordinatorTest, LogsAreStoredPerRankAndStreamed) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  const auto ref = Drain(queue).at(0).run().ref();
  Log("w1", ref, "hello ");
  Log("w1", ref, "world\n");
  std::ifstream file(c_->LogPath(job.id(), 0));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "hello world\n");

  v1::StreamLogsRequest request;
  request.set_job_id(job.id());
  request.set_offset(6);
  std::string got;
  ASSERT_TRUE(Logs(request, [&](const v1::LogChunk& chunk) {
                EXPECT_EQ(chunk.offset(), 6 + static_cast<int64_t>(got.size()));
                got += chunk.data();
                return true;
              }).ok());
  EXPECT_EQ(got, "world\n");

  // Following ends once the job is terminal, after the last bytes.
  request.set_follow(true);
  request.set_offset(0);
  got.clear();
  std::thread follower([&] {
    EXPECT_TRUE(Logs(request, [&](const v1::LogChunk& chunk) {
                  got += chunk.data();
                  return true;
                }).ok());
  });
  Log("w1", ref, "bye\n");
  Exited("w1", ref, 0);
  follower.join();
  EXPECT_EQ(got, "hello world\nbye\n");

  request.set_rank(3);
  EXPECT_EQ(c_->StreamLogs(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.set_job_id("nope");
  EXPECT_EQ(c_->StreamLogs(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, WatchFollowsLiveEventsAndEndsOnShutdown) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  const auto ref = Drain(queue).at(0).run().ref();
  std::vector<v1::JobEvent> events;
  std::mutex mu;
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  std::thread watcher([&] {
    EXPECT_TRUE(Watch(request, [&](const v1::JobEvent& e) {
                  std::lock_guard<std::mutex> lock(mu);
                  events.push_back(e);
                  return true;
                }).ok());
  });
  Started("w1", ref);
  Exited("w1", ref, 0);
  watcher.join();
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back().state_change().to(), v1::JOB_STATE_SUCCEEDED);

  const v1::Job pending = Submit(8);
  request.set_job_id(pending.id());
  std::thread blocked([&] {
    EXPECT_EQ(Watch(request, [](const v1::JobEvent&) { return true; }).code(),
              absl::StatusCode::kUnavailable);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c_->Shutdown();
  blocked.join();
  request.set_job_id("nope");
  EXPECT_EQ(c_->WatchJob(request).status().code(), absl::StatusCode::kNotFound);
}

// Pages end by bytes too, so big jobs never make one answer exceed a client's message limit.
TEST_F(CoordinatorTest, ListJobsPagesByBytes) {
  for (int i = 0; i < 5; ++i) {
    auto request = SubmitRequest();
    request.mutable_spec()->set_name(std::string(4000, 'a' + i));
    request.mutable_spec()->mutable_stages(0)->set_name(std::string(4000, 'x'));
    for (int stage = 0; stage < 200; ++stage) {  // ~800 KB a job
      *request.mutable_spec()->add_stages() = request.spec().stages(0);
    }
    ASSERT_TRUE(c_->SubmitJob(request).ok());
  }
  v1::ListJobsRequest request;
  auto page = c_->ListJobs(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_LT(page->ByteSizeLong(), size_t{2} << 20);
  EXPECT_GT(page->jobs_size(), 0);
  EXPECT_LT(page->jobs_size(), 5);
  EXPECT_FALSE(page->next_page_token().empty());
}

// Workers come in pages by id, by count and by bytes.
TEST_F(CoordinatorTest, ListWorkersPages) {
  for (int i = 0; i < 5; ++i) {
    auto request = WorkerRequest("w" + std::to_string(i), 1);
    for (int slot = 0; slot < 2000; ++slot) {  // ~600 KB of running ranks a worker
      auto* ref = request.add_running();
      ref->set_job_id(std::string(256, 'j'));
      ref->set_rank(slot);
    }
    ASSERT_TRUE(c_->RegisterWorker(request).ok());
  }
  v1::ListWorkersRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    auto response = c_->ListWorkers(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_LE(response->workers_size(), 2);
    EXPECT_LT(response->ByteSizeLong(), size_t{2} << 20);
    for (const auto& worker : response->workers()) seen.push_back(worker.id());
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"w0", "w1", "w2", "w3", "w4"}));
  request.set_page_size(0);
  request.clear_page_token();
  auto by_bytes = c_->ListWorkers(request);
  ASSERT_TRUE(by_bytes.ok());
  EXPECT_LT(by_bytes->workers_size(), 5);  // 5 x ~600 KB passes 2 MiB
  EXPECT_FALSE(by_bytes->next_page_token().empty());
  request.set_page_size(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(c_->ListWorkers(request).status()));
}

TEST_F(CoordinatorTest, ListJobsPagesNewestFirst) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Submit().id());
  ASSERT_TRUE(c_->CancelJob(ids[1], "").ok());
  v1::ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 5; ++page) {
    auto response = c_->ListJobs(request);
    ASSERT_TRUE(response.ok());
    for (const auto& job : response->jobs()) seen.push_back(job.id());
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  EXPECT_EQ(seen, std::vector<std::string>(ids.rbegin(), ids.rend()));

  v1::ListJobsRequest cancelled;
  cancelled.add_states(v1::JOB_STATE_CANCELLED);
  auto only = c_->ListJobs(cancelled);
  ASSERT_EQ(only->jobs_size(), 1);
  EXPECT_EQ(only->jobs(0).id(), ids[1]);
  EXPECT_TRUE(only->next_page_token().empty());

  v1::ListJobsRequest bad;
  bad.set_page_token("garbage!");
  EXPECT_EQ(c_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_page_token("");
  bad.set_page_size(-1);
  EXPECT_EQ(c_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->GetJob("nope").status().code(), absl::StatusCode::kNotFound);
}

// DeepSeek-V3.2's recipe from a spec of one stage: that stage as the dense warm-up of the
// indexer alone ("warmup"), then a sparse stage training every weight ("sparse", `sparse_steps`).
void WarmUpThenSparse(v1::JobSpec* spec, int sparse_steps) {
  v1::StageSpec* warm_up = spec->mutable_stages(0);
  warm_up->set_name("warmup");
  warm_up->set_attention(v1::DENSE);
  warm_up->set_trains(v1::INDEXER_ONLY);
  warm_up->set_indexer_loss_weight(1);
  v1::StageSpec* sparse = spec->add_stages();
  *sparse = spec->stages(0);
  sparse->set_name("sparse");
  sparse->set_steps(sparse_steps);
  sparse->set_attention(v1::SPARSE);
  sparse->set_trains(v1::ALL);
}

TEST_F(CoordinatorTest, PlanIsSingleDeviceWithPlacement) {
  v1::PlanJobRequest request;
  *request.mutable_spec() = testing::TinySpec();
  auto plan = c_->PlanJob(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks(), 1);
  EXPECT_EQ(plan->cp_layout(), "none");
  EXPECT_GT(plan->memory_bytes_per_rank(), 0);
  EXPECT_GT(plan->step_seconds(), 0);
  ASSERT_FALSE(plan->notes().empty());
  EXPECT_EQ(plan->notes(0).rfind("winner cp 1 ", 0), 0u) << plan->notes(0);
  EXPECT_FALSE(plan->feasible());
  EXPECT_FALSE(plan->reason().empty());
  Register("w1", 1);
  plan = c_->PlanJob(request);
  EXPECT_TRUE(plan->feasible());
  ASSERT_EQ(plan->placement_size(), 1);
  EXPECT_EQ(plan->placement(0).worker_id(), "w1");
  EXPECT_EQ(plan->stages_size(), 0);  // one stage: the fields above are it

  // Two stages (a dense warm-up of the indexer alone, then the sparse stage): each on its own.
  WarmUpThenSparse(request.mutable_spec(), 30);
  plan = c_->PlanJob(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2);
  EXPECT_EQ(plan->stages(0).name(), "warmup");
  EXPECT_EQ(plan->stages(1).steps(), 30);
  EXPECT_EQ(plan->stages(1).step_seconds(), plan->step_seconds());  // planned on the sparse one
  EXPECT_NE(plan->stages(0).step_seconds(), plan->step_seconds());
  EXPECT_EQ(plan->memory_bytes_per_rank(), std::max(plan->stages(0).memory_bytes_per_rank(),
                                                    plan->stages(1).memory_bytes_per_rank()));
  EXPECT_DOUBLE_EQ(plan->job_seconds(),
                   20 * plan->stages(0).step_seconds() + 30 * plan->stages(1).step_seconds());

  request.mutable_spec()->mutable_data()->set_seq_len(0);
  EXPECT_NE(std::string(c_->PlanJob(request).status().message()).find("spec.data.seq_len"),
            std::string::npos);
}

TEST_F(CoordinatorTest, ContextParallelJobsRunOneRankPerCpProcess) {
  v1::SubmitJobRequest request = SubmitRequest();
  auto* parallelism = request.mutable_spec()->mutable_parallelism();
  parallelism->set_mode(v1::MANUAL);
  parallelism->set_context_parallel(2);
  parallelism->set_cp_layout("zigzag");
  auto job = c_->SubmitJob(request);  // ranks left at 1: the spec's degree
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->resources().ranks(), 2);

  request.mutable_resources()->set_ranks(4);
  const auto mismatch = c_->SubmitJob(request);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(mismatch.status().message()).find("resources.ranks: must be 2"),
            std::string::npos)
      << mismatch.status();
}

// The 4-layer reference model (examples/train-ref-2048x4.yaml) over `tokens`, one sparse stage,
// recomputed with replay.
v1::JobSpec ReferenceSpec(int64_t tokens) {
  v1::JobSpec spec = testing::TinySpec();
  auto* m = spec.mutable_model();
  m->set_vocab_size(256);
  m->set_d_model(2048);
  m->set_layers(4);
  m->set_heads(64);
  m->set_head_dim_qk(576);
  m->set_rope_dim(64);
  m->set_head_dim_v(512);
  m->set_latent_kv(true);
  m->set_d_ff(5632);
  m->mutable_indexer()->set_heads(64);
  m->mutable_indexer()->set_dim(128);
  m->mutable_indexer()->set_rope_dim(64);
  m->mutable_indexer()->set_topk(2048);
  spec.mutable_data()->set_seq_len(tokens);
  spec.mutable_data()->set_batch_size(1);
  spec.clear_stages();
  auto* stage = spec.add_stages();
  stage->set_steps(1);
  stage->set_lr(1e-4f);
  stage->set_attention(v1::SPARSE);
  stage->set_indexer_loss_weight(0.01f);
  spec.mutable_recompute()->set_enabled(true);
  spec.mutable_recompute()->set_selection_replay(true);
  return spec;
}

// A job longer than one GPU holds whole (the 4-layer reference model at 1M tokens, recomputed):
// the plan names the query chunk the trainer will run in; an AUTO submission leaves the spec's 0,
// so that the trainer fits the chunk to the device it lands on, stage by stage.
TEST_F(CoordinatorTest, PlanNamesTheQueryChunkOfALongJob) {
  const v1::JobSpec spec = ReferenceSpec(1 << 20);
  v1::PlanJobRequest request;
  *request.mutable_spec() = spec;
  request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  const auto plan = c_->PlanJob(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GE(plan->query_chunk(), planner::kMinQueryChunk) << plan->notes(0);
  EXPECT_LT(plan->query_chunk(), 1 << 20);
  EXPECT_NE(plan->notes(0).find(absl::StrCat(" chunks of ", plan->query_chunk())),
            std::string::npos)
      << plan->notes(0);

  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = spec;
  submit.mutable_spec()->mutable_parallelism()->set_mode(v1::AUTO);
  submit.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  const auto job = c_->SubmitJob(submit);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().recompute().query_chunk(), 0);
}

// The coordinator's GPU profile is an H200's (141 GB), its workers' cards 80 GB: an AUTO job is
// planned within the memory of the devices it can land on. The reference model at 64K without
// recomputation needs about 86 GiB (the H200's plan); on the workers' cards it is recomputed,
// fits and is placed, where the H200's plan would wait for a card the fleet lacks. A job planned
// before any worker registered is planned again once they do (JobReplanned), and placed.
TEST_F(CoordinatorTest, AutoPlansFitTheOnlineWorkersDevices) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = ReferenceSpec(65536);
  request.mutable_spec()->mutable_parallelism()->set_mode(v1::AUTO);
  request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  request.set_request_id("first");
  constexpr int64_t kWorkersCard = 80'000'000'000;  // testing::WorkerRequest's

  const auto on_profile = c_->SubmitJob(request);  // no workers yet: the profile stands
  ASSERT_TRUE(on_profile.ok()) << on_profile.status();
  EXPECT_FALSE(on_profile->spec().recompute().enabled());
  EXPECT_GT(on_profile->resources().memory_bytes_per_rank(), kWorkersCard);
  EXPECT_EQ(on_profile->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(on_profile->requested_spec().parallelism().mode(), v1::AUTO);
  request.set_request_id("second");

  v1::PlanJobRequest plan_request;
  *plan_request.mutable_spec() = request.spec();
  *plan_request.mutable_resources() = request.resources();
  Register("w1", 2);
  const auto plan = c_->PlanJob(plan_request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->feasible()) << plan->reason();
  EXPECT_LE(plan->memory_bytes_per_rank(), planner::UsableMemoryBytes(kWorkersCard));
  c_->Tick();
  // The first job, planned for the profile's card, is planned again for the workers' and placed.
  const auto replanned = c_->GetJob(on_profile->id());
  ASSERT_TRUE(replanned.ok()) << replanned.status();
  EXPECT_TRUE(replanned->spec().recompute().enabled());
  EXPECT_LE(replanned->resources().memory_bytes_per_rank(),
            planner::UsableMemoryBytes(kWorkersCard));
  EXPECT_EQ(replanned->state(), v1::JOB_STATE_SCHEDULED);
  const auto events = c_->JobEvents(on_profile->id(), 0, 100);
  ASSERT_TRUE(events.ok()) << events.status();
  const auto event = std::find_if(events->begin(), events->end(),
                                  [](const v1::JobEvent& e) { return e.has_replanned(); });
  ASSERT_NE(event, events->end());
  EXPECT_TRUE(absl::StrContains(event->replanned().reason(), "planned again"))
      << event->replanned().reason();
  EXPECT_TRUE(event->replanned().recompute().enabled());
  EXPECT_EQ(event->replanned().memory_bytes_per_rank(),
            replanned->resources().memory_bytes_per_rank());

  const auto on_fleet = c_->SubmitJob(request);
  ASSERT_TRUE(on_fleet.ok()) << on_fleet.status();
  EXPECT_TRUE(on_fleet->spec().recompute().enabled());
  EXPECT_LE(on_fleet->resources().memory_bytes_per_rank(),
            planner::UsableMemoryBytes(kWorkersCard));
  EXPECT_EQ(on_fleet->state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(on_fleet->placement_size(), 1);
  EXPECT_EQ(on_fleet->placement(0).worker_id(), "w1");

  // A retry of the first submission is the same request, though it runs another plan now; also
  // after a restart of the coordinator, which keeps the new plan.
  request.set_request_id("first");
  EXPECT_EQ(c_->SubmitJob(request)->id(), on_profile->id());
  c_.reset();
  Open();
  EXPECT_EQ(c_->SubmitJob(request)->id(), on_profile->id());
  EXPECT_TRUE(c_->GetJob(on_profile->id())->spec().recompute().enabled());
  request.set_priority(3);
  EXPECT_EQ(c_->SubmitJob(request).status().code(), absl::StatusCode::kAlreadyExists);
}

// Only a plan the workers' devices cannot hold is made again, and only from what the request left
// to the coordinator: a job that set its memory keeps it (and waits, saying why); one whose plan
// fits keeps it when a larger card joins.
TEST_F(CoordinatorTest, OnlyPlansTheDevicesCannotHoldAreMadeAgain) {
  v1::SubmitJobRequest pinned;
  *pinned.mutable_spec() = ReferenceSpec(65536);
  pinned.mutable_spec()->mutable_parallelism()->set_mode(v1::AUTO);
  pinned.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  pinned.mutable_resources()->set_memory_bytes_per_rank(100'000'000'000);
  const auto waits = c_->SubmitJob(pinned);
  ASSERT_TRUE(waits.ok()) << waits.status();
  Register("w1", 1);
  c_->Tick();
  const auto still = c_->GetJob(waits->id());
  EXPECT_EQ(still->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(still->resources().memory_bytes_per_rank(), 100'000'000'000);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(still->spec(), waits->spec()));
  EXPECT_FALSE(Replanned(waits->id()));

  // w1's one GPU is free; the next job fits it and is placed; a worker with a larger card joining
  // moves nothing.
  v1::SubmitJobRequest fits = pinned;
  fits.mutable_resources()->set_memory_bytes_per_rank(0);
  *fits.mutable_spec() = ReferenceSpec(32768);
  fits.mutable_spec()->mutable_parallelism()->set_mode(v1::AUTO);
  const auto placed = c_->SubmitJob(fits);
  ASSERT_TRUE(placed.ok()) << placed.status();
  const auto queued = c_->SubmitJob(fits);  // waits for a free device
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->state(), v1::JOB_STATE_PENDING);
  v1::RegisterWorkerRequest big = testing::WorkerRequest("big", 1);
  big.mutable_devices(0)->set_memory_bytes(141'000'000'000);
  ASSERT_TRUE(c_->RegisterWorker(big).ok());
  c_->Tick();
  EXPECT_FALSE(Replanned(queued->id()));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(c_->GetJob(queued->id())->spec(),
                                                                 queued->spec()));
}

// The coordinator's profile is an H200's; a worker's H100s are planned with the h800 profile's
// figures (the same SXM part), and a device whose name names no profile keeps the configured one.
TEST_F(CoordinatorTest, PlansForTheWorkersCardByName) {
  v1::PlanJobRequest request;
  *request.mutable_spec() = ReferenceSpec(32768);
  request.mutable_spec()->mutable_parallelism()->set_mode(v1::AUTO);
  request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  const auto notes = [&] {
    const auto plan = c_->PlanJob(request);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? absl::StrJoin(plan->notes(), "\n") : std::string();
  };
  v1::RegisterWorkerRequest unnamed = testing::WorkerRequest("plain", 1);
  unnamed.mutable_devices(0)->set_name("gpu");
  ASSERT_TRUE(c_->RegisterWorker(unnamed).ok());
  EXPECT_TRUE(absl::StrContains(notes(), "profile h200")) << notes();
  v1::RegisterWorkerRequest h100 = testing::WorkerRequest("h100", 1);
  h100.mutable_devices(0)->set_name("NVIDIA H100 80GB HBM3");
  h100.mutable_devices(0)->set_memory_bytes(85'899'345'920);  // 80 GiB
  ASSERT_TRUE(c_->RegisterWorker(h100).ok());
  EXPECT_TRUE(absl::StrContains(notes(), "profile h800 (the workers' NVIDIA H100 80GB HBM3)"))
      << notes();
}

// Re-planning is a planner search a job, under the coordinator's lock: a pass does at most 64,
// and the passes after it the rest.
TEST_F(CoordinatorTest, ReplansAreSpreadOverPasses) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = ReferenceSpec(65536);
  request.mutable_spec()->mutable_parallelism()->set_mode(v1::AUTO);
  request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
  std::vector<std::string> ids;
  for (int i = 0; i < 70; ++i) {
    const auto job = c_->SubmitJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
  }
  const auto replanned = [&] {
    return std::count_if(ids.begin(), ids.end(),
                         [&](const std::string& id) { return Replanned(id); });
  };
  Register("w1", 1);  // (its registration's own pass is the first)
  EXPECT_EQ(replanned(), 64);
  c_->Tick();
  EXPECT_EQ(replanned(), 70);
  c_->Tick();  // nothing left to plan: the count stays
  EXPECT_EQ(replanned(), 70);
}

TEST_F(CoordinatorTest, AutoParallelismIsPlannedAtSubmission) {
  v1::SubmitJobRequest request = SubmitRequest(4, 0, 0);
  v1::JobSpec& spec = *request.mutable_spec();
  spec.mutable_data()->set_seq_len(4096);
  spec.mutable_stages(0)->set_attention(v1::SPARSE);
  spec.mutable_parallelism()->set_mode(v1::AUTO);
  auto job = c_->SubmitJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::ParallelismSpec& planned = job->spec().parallelism();
  EXPECT_EQ(planned.mode(), v1::AUTO);
  // 4096 tokens allow CP up to 4 (kMinShardTokens); the planner's choice is written back whole.
  EXPECT_GE(planned.context_parallel(), 1);
  EXPECT_LE(planned.context_parallel(), 4);
  EXPECT_FALSE(planned.cp_layout().empty());
  EXPECT_GE(planned.query_group(), 1);
  // A separate indexer group only means something with more than one rank.
  if (planned.context_parallel() == 1) {
    EXPECT_FALSE(planned.separate_indexer_group());
  }
  EXPECT_TRUE(hyscale::ValidateJobSpec(job->spec()).ok()) << hyscale::ValidateJobSpec(job->spec());
  EXPECT_EQ(job->resources().ranks(), planned.context_parallel());  // what the plan uses
  // Queued (no workers): its per-job series start once it is placed.
  const std::string text = metrics_.Render();
  EXPECT_EQ(text.find("hyscale_job_predicted_step_seconds{job_id=\"" + job->id() + "\"} "),
            std::string::npos);

  // Nothing fits: the submission fails and says why.
  spec.mutable_model()->set_vocab_size(1 << 24);
  spec.mutable_model()->set_d_model(4096);
  const auto too_big = c_->SubmitJob(request);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_big.status().message())
                .find("spec.parallelism.mode: AUTO found no plan for 4 h200 devices: no plan fits"),
            std::string::npos)
      << too_big.status();
}

TEST_F(CoordinatorTest, MetricsFollowTheJobs) {
  auto queue = Register("w1", 1);
  const v1::Job job = Submit();
  const auto ref = Drain(queue).at(0).run().ref();
  EventLine("w1", ref, R"({"step":{"step":1,"step_seconds":0.5,"phase_seconds":{"data":0.1}}})");
  std::string text = metrics_.Render();
  EXPECT_NE(text.find("hyscale_jobs{state=\"scheduled\"} 1"), std::string::npos);
  EXPECT_NE(text.find("hyscale_job_step{job_id=\"" + job.id() + "\"} 1"), std::string::npos);
  EXPECT_NE(text.find("hyscale_workers{state=\"online\"} 1"), std::string::npos);
  Exited("w1", ref, 0);
  clock_.Advance(absl::Minutes(2));
  Heartbeat("w1", {});
  c_->Tick();
  text = metrics_.Render();
  EXPECT_EQ(text.find(job.id()), std::string::npos);  // dropped after the retention
  EXPECT_NE(text.find("hyscale_jobs{state=\"succeeded\"} 1"), std::string::npos);
}

// A job of two stages (the dense warm-up of the indexer alone, then the sparse stage) exports the
// planner's step time for the stage its trainer starts: the warm-up's own, then the sparse stage's,
// which is the job's plan (its costly stage at length).
TEST_F(CoordinatorTest, AStartedStageExportsItsOwnPredictedStep) {
  auto queue = Register("w1", 1);
  v1::SubmitJobRequest request = SubmitRequest();
  request.mutable_spec()->mutable_data()->set_seq_len(4096);
  WarmUpThenSparse(request.mutable_spec(), 20);
  const auto job = c_->SubmitJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  const auto ref = Drain(queue).at(0).run().ref();
  const std::string series = "hyscale_job_predicted_step_seconds{job_id=\"" + job->id() + "\"} ";
  const auto predicted = [&] {
    const std::string text = metrics_.Render();
    const size_t at = text.find(series);
    EXPECT_NE(at, std::string::npos) << text;
    return at == std::string::npos ? 0.0 : std::stod(text.substr(at + series.size()));
  };
  const double planned = predicted();
  EXPECT_GT(planned, 0);
  EventLine(
      "w1", ref,
      R"({"stage_started":{"stage":0,"name":"warmup","predicted_memory":{"total_bytes":1000}}})");
  const double warming_up = predicted();
  EXPECT_GT(warming_up, 0);
  EXPECT_NE(warming_up, planned);
  EventLine(
      "w1", ref,
      R"({"stage_started":{"stage":1,"name":"sparse","predicted_memory":{"total_bytes":1000}}})");
  EXPECT_EQ(predicted(), planned);
}

TEST_F(CoordinatorTest, ConcurrentClientsWorkersAndWatchers) {
  // Four workers run whatever they are given while clients submit and watch: every job ends
  // SUCCEEDED exactly once, and every watch ends with it.
  constexpr int kWorkers = 4;
  constexpr int kJobsPerClient = 8;
  std::vector<std::shared_ptr<AssignmentQueue>> queues;
  for (int w = 0; w < kWorkers; ++w) queues.push_back(Register("w" + std::to_string(w), 1));
  std::atomic<bool> done{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      const std::string name = "w" + std::to_string(w);
      while (!done) {
        const std::vector<v1::Assignment> assignments = Drain(queues[w]);
        if (assignments.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        for (const auto& next : assignments) {
          if (!next.has_run()) continue;
          Started(name, next.run().ref());
          EventLine(name, next.run().ref(), R"({"step":{"step":1,"total_steps":1}})");
          Log(name, next.run().ref(), "line\n");
          Exited(name, next.run().ref(), 0);
        }
      }
    });
  }
  std::mutex mu;
  std::vector<std::string> ids;
  std::vector<std::thread> clients;
  std::atomic<int> watched{0};
  for (int c = 0; c < 2; ++c) {
    clients.emplace_back([&] {
      for (int j = 0; j < kJobsPerClient; ++j) {
        auto job = c_->SubmitJob(SubmitRequest());
        ASSERT_TRUE(job.ok());
        {
          std::lock_guard<std::mutex> lock(mu);
          ids.push_back(job->id());
        }
        v1::WatchJobRequest watch;
        watch.set_job_id(job->id());
        v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
        ASSERT_TRUE(Watch(watch, [&](const v1::JobEvent& e) {
                      if (e.has_state_change()) last = e.state_change().to();
                      return true;
                    }).ok());
        EXPECT_EQ(last, v1::JOB_STATE_SUCCEEDED);
        ++watched;
      }
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  for (auto& t : workers) t.join();
  EXPECT_EQ(watched.load(), 2 * kJobsPerClient);
  for (const auto& id : ids) {
    auto job = c_->GetJob(id);
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(job->restarts(), 0);
  }
}

}  // namespace
}  // namespace hyscale::server
