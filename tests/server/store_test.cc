#include "server/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "util/temp_dir.h"

namespace hyscale::server {
namespace {

class StoreTest : public ::testing::Test {
 protected:
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

  const util::TempDir dir_ = util::TempDir::Create("store_test").value();
  const std::string path_ = dir_.Path("hyscale.db");
  std::vector<std::string> set_aside_;  // LoadJobs' unreadable records
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
    ASSERT_TRUE((*store)->PutWorker(worker, "agent-a").ok());
    worker.set_address("10.0.0.2");
    ASSERT_TRUE((*store)->PutWorker(worker, "agent-b").ok());
  }
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs(&set_aside_);
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
  EXPECT_EQ((*workers)[0].info.address(), "10.0.0.2");
  EXPECT_EQ((*workers)[0].instance, "agent-b");
}

TEST_F(StoreTest, RequestIdIsUniqueWhenSet) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("a", "same"), {}).ok());
  EXPECT_EQ((*store)->InsertJob(MakeJob("b", "same"), {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE((*store)->InsertJob(MakeJob("c", ""), {}).ok());
  EXPECT_TRUE((*store)->InsertJob(MakeJob("d", ""), {}).ok());
  // The failed insert left nothing behind.
  EXPECT_EQ((*store)->LoadJobs(&set_aside_)->size(), 3u);
}

TEST_F(StoreTest, EventAndJobAreOneTransaction) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("a", ""), {Event("a", 1, v1::JOB_STATE_PENDING)}).ok());
  v1::Job a = MakeJob("a", "");
  a.set_state(v1::JOB_STATE_RUNNING);
  // Sequence 1 exists: the event insert fails, and the job update must roll back with it.
  EXPECT_FALSE((*store)->UpdateJob(a, {Event("a", 1, v1::JOB_STATE_RUNNING)}).ok());
  EXPECT_EQ((*store)->LoadJobs(&set_aside_)->at(0).state(), v1::JOB_STATE_PENDING);
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

// One damaged job record neither stops loading nor vanishes: it moves to jobs_set_aside.
TEST_F(StoreTest, UnreadableJobRecordIsSetAside) {
  {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok());
    for (const char* id : {"a", "b", "c"})
      ASSERT_TRUE((*store)->InsertJob(MakeJob(id, ""), {}).ok());
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE jobs SET job = x'ffffffffff' WHERE id = 'b'", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs(&set_aside_);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ(jobs->at(0).id(), "a");
  EXPECT_EQ(jobs->at(1).id(), "c");
  EXPECT_EQ(set_aside_, std::vector<std::string>{"b"});
  set_aside_.clear();
  EXPECT_EQ((*store)->LoadJobs(&set_aside_)->size(), 2u);
  EXPECT_TRUE(set_aside_.empty());  // moved once
  store->reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* select = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT id, hex(job) FROM jobs_set_aside", -1, &select, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(select), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(select, 0)), "b");
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(select, 1)), "FFFFFFFFFF");
  sqlite3_finalize(select);
  sqlite3_close(db);
}

TEST_F(StoreTest, DamagedDatabaseIsRefused) {
  {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok());
    for (int i = 0; i < 200; ++i) {
      v1::Job job = MakeJob("job-" + std::to_string(i), "");
      job.set_reason(std::string(1000, 'r'));
      ASSERT_TRUE((*store)->InsertJob(job, {}).ok());
    }
  }
  {
    // Garbage over a page in the middle of the jobs table.
    FILE* file = std::fopen(path_.c_str(), "r+b");
    ASSERT_NE(file, nullptr);
    std::fseek(file, 20 * 4096, SEEK_SET);
    const std::string garbage(4096, '\x55');
    std::fwrite(garbage.data(), 1, garbage.size(), file);
    std::fclose(file);
  }
  auto store = Store::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find("integrity check failed"), std::string::npos)
      << store.status();
}

// A backup taken while the store is open and written is a complete, consistent copy.
TEST_F(StoreTest, BackupWhileServing) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("a", ""), {Event("a", 1, v1::JOB_STATE_PENDING)}).ok());
  const std::string copy = dir_.Path("backup.db");
  ASSERT_TRUE(Store::Backup(path_, copy).ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("b", ""), {}).ok());  // after the snapshot
  auto restored = Store::Open(copy);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto jobs = (*restored)->LoadJobs(&set_aside_);
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->at(0).id(), "a");
  EXPECT_EQ((*restored)->LastSequence("a").value(), 1);
  EXPECT_FALSE(std::filesystem::exists(copy + ".partial"));
  EXPECT_FALSE(Store::Backup(dir_.Path("none.db"), copy).ok());
}

// Submissions synced from many threads at once share commits, and every one is on disk.
TEST_F(StoreTest, GroupCommitStoresEverySyncedJob) {
  constexpr int kThreads = 16;
  constexpr int kPerThread = 25;
  {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok());
    std::vector<std::thread> threads;
    std::atomic<int> failed{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const std::string id = "j" + std::to_string(t) + "-" + std::to_string(i);
          const Store::Ticket ticket = (*store)->StageInsert(MakeJob(id, "req-" + id),
                                                             {Event(id, 1, v1::JOB_STATE_PENDING)});
          if (!(*store)->Sync(ticket).ok() || !(*store)->Stored(ticket)) ++failed;
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(failed.load(), 0);
  }
  auto reopened = Store::Open(path_);
  ASSERT_TRUE(reopened.ok());
  auto jobs = (*reopened)->LoadJobs(&set_aside_);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), size_t{kThreads * kPerThread});
  EXPECT_EQ((*reopened)->LastSequence("j3-7").value(), 1);
}

// A change of a staged job written before its submission synced carries the job with it, in
// order: the update never reaches the disk without the insert.
TEST_F(StoreTest, WriteOfAStagedJobWritesTheJobFirst) {
  {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok());
    const Store::Ticket ticket =
        (*store)->StageInsert(MakeJob("a", ""), {Event("a", 1, v1::JOB_STATE_PENDING)});
    EXPECT_FALSE((*store)->Stored(ticket));
    v1::Job a = MakeJob("a", "");
    a.set_state(v1::JOB_STATE_SCHEDULED);
    ASSERT_TRUE((*store)->UpdateJob(a, {Event("a", 2, v1::JOB_STATE_SCHEDULED)}).ok());
    EXPECT_TRUE((*store)->Stored(ticket));
    EXPECT_TRUE((*store)->Sync(ticket).ok());
  }
  auto reopened = Store::Open(path_);
  auto jobs = (*reopened)->LoadJobs(&set_aside_);
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->at(0).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ((*reopened)->LastSequence("a").value(), 2);
}

// A write that fails on its own (an update of a job that is not stored) does not take the staged
// jobs of its transaction down with it.
TEST_F(StoreTest, FailedWriteKeepsTheStagedJobs) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  const Store::Ticket ticket = (*store)->StageInsert(MakeJob("a", ""), {});
  EXPECT_EQ((*store)->UpdateJob(MakeJob("missing", ""), {}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*store)->Sync(ticket).ok());
  EXPECT_TRUE((*store)->Stored(ticket));
  EXPECT_EQ((*store)->LoadJobs(&set_aside_)->size(), 1u);
}

// A staged job that cannot be written fails its Sync, names why, and is not stored.
TEST_F(StoreTest, UnwritableStagedJobFailsItsSync) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("a", "same"), {}).ok());
  const Store::Ticket ticket = (*store)->StageInsert(MakeJob("b", "same"), {});
  const absl::Status status = (*store)->Sync(ticket);
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE((*store)->Stored(ticket));
  EXPECT_EQ((*store)->LoadJobs(&set_aside_)->size(), 1u);
  // The next submission is not affected.
  const Store::Ticket next = (*store)->StageInsert(MakeJob("c", ""), {});
  EXPECT_TRUE((*store)->Sync(next).ok());
}

// Staged jobs written inside a Batch are stored when it commits and fail when it rolls back.
TEST_F(StoreTest, BatchSettlesTheStagedJobsItWrote) {
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->InsertJob(MakeJob("x", ""), {}).ok());
  const Store::Ticket kept = (*store)->StageInsert(MakeJob("a", ""), {});
  {
    Store::Batch batch(**store);
    ASSERT_TRUE((*store)->UpdateJob(MakeJob("x", ""), {}).ok());
    EXPECT_FALSE((*store)->Stored(kept));
    ASSERT_TRUE(batch.Commit().ok());
  }
  EXPECT_TRUE((*store)->Stored(kept));
  const Store::Ticket lost = (*store)->StageInsert(MakeJob("b", ""), {});
  {
    Store::Batch batch(**store);
    ASSERT_TRUE((*store)->UpdateJob(MakeJob("x", ""), {}).ok());
  }  // rolled back
  EXPECT_FALSE((*store)->Sync(lost).ok());
  EXPECT_FALSE((*store)->Stored(lost));
  EXPECT_EQ((*store)->LoadJobs(&set_aside_)->size(), 2u);
}

TEST_F(StoreTest, UnwritableLocationIsAnError) {
  auto store = Store::Open(dir_.Path("missing/hyscale.db"));
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace hyscale::server
