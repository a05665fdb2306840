#include "server/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>

namespace hyscale::server {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("store_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "hyscale.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static v1::Job MakeJob(const std::string& id, const std::string& request_id) {
    v1::Job job;
    job.set_id(id);
    job.set_request_id(request_id);
    job.set_state(v1::JOB_STATE_PENDING);
    job.set_priority(3);
    return job;
  }
  static v1::JobEvent Event(const std::string& job_id, int64_t sequence, v1::JobState to) {
    v1::JobEvent event;
    event.set_job_id(job_id);
    event.set_sequence(sequence);
    event.mutable_state_change()->set_to(to);
    return event;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(StoreTest, FreshStoreIsMigratedAndInWalMode) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->JournalMode(), "wal");
  EXPECT_EQ(*(*store)->SchemaVersion(), Store::LatestSchemaVersion());
}

TEST_F(StoreTest, JobsEventsAndWorkersSurviveReopen) {
  {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(
        (*store)->InsertJob(MakeJob("a", "req-a"), {Event("a", 1, v1::JOB_STATE_PENDING)}).ok());
    ASSERT_TRUE((*store)->InsertJob(MakeJob("b", ""), {Event("b", 1, v1::JOB_STATE_PENDING)}).ok());
    v1::Job a = MakeJob("a", "req-a");
    a.set_state(v1::JOB_STATE_SCHEDULED);
    ASSERT_TRUE((*store)->UpdateJob(a, {Event("a", 2, v1::JOB_STATE_SCHEDULED)}).ok());
    v1::WorkerInfo worker;
    worker.set_id("w1");
    worker.set_address("10.0.0.1");
    ASSERT_TRUE((*store)->PutWorker(worker).ok());
    worker.set_address("10.0.0.2");
    ASSERT_TRUE((*store)->PutWorker(worker).ok());
  }
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "a");  // insertion order
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ((*jobs)[1].id(), "b");
  auto events = (*store)->LoadEvents("a", 0, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].state_change().to(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ((*store)->LoadEvents("a", 1, 100)->size(), 1u);
  EXPECT_EQ(*(*store)->LastSequence("a"), 2);
  EXPECT_EQ(*(*store)->LastSequence("none"), 0);
  auto workers = (*store)->LoadWorkers();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].address(), "10.0.0.2");
}

TEST_F(StoreTest, RequestIdIsUniqueWhenSet) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("a", "same"), {}).ok());
  EXPECT_EQ((*store)->InsertJob(MakeJob("b", "same"), {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE((*store)->InsertJob(MakeJob("c", ""), {}).ok());
  EXPECT_TRUE((*store)->InsertJob(MakeJob("d", ""), {}).ok());
  // The failed insert left nothing behind.
  EXPECT_EQ((*store)->LoadJobs()->size(), 3u);
}

TEST_F(StoreTest, EventAndJobAreOneTransaction) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("a", ""), {Event("a", 1, v1::JOB_STATE_PENDING)}).ok());
  v1::Job a = MakeJob("a", "");
  a.set_state(v1::JOB_STATE_RUNNING);
  // Sequence 1 exists: the event insert fails, and the job update must roll back with it.
  EXPECT_FALSE((*store)->UpdateJob(a, {Event("a", 1, v1::JOB_STATE_RUNNING)}).ok());
  EXPECT_EQ((*store)->LoadJobs()->at(0).state(), v1::JOB_STATE_PENDING);
}

TEST_F(StoreTest, OlderSchemaIsMigratedAndNewerRefused) {
  {
    // A database as an older hyscaled left it: schema_version 0, no tables.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE schema_version (version INTEGER NOT NULL);"
                           "INSERT INTO schema_version VALUES (0);",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->SchemaVersion(), Store::LatestSchemaVersion());
    EXPECT_TRUE((*store)->InsertJob(MakeJob("a", ""), {}).ok());
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(
        sqlite3_exec(db, "UPDATE schema_version SET version = 999", nullptr, nullptr, nullptr),
        SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = Store::Open(path_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(StoreTest, UnwritableLocationIsAnError) {
  auto store = Store::Open((dir_ / "missing" / "hyscale.db").string());
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace hyscale::server
