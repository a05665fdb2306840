// JobStore: the coordinator's durable state in one SQLite file (<data-dir>/hyscale.db).
// Every write is a transaction with synchronous=FULL in WAL mode, so a job's transition and its
// event are on disk together before the RPC that caused them answers.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hyscale/v1/service.pb.h"

struct sqlite3;

namespace hyscale::server {

class Store {
 public:
  // Opens (creating if needed) `path`, checks it (PRAGMA integrity_check: a damaged database is
  // refused, FAILED_PRECONDITION quoting SQLite's findings, rather than served) and brings its
  // schema up to the newest version.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);

  // Copies the database at `path` to `to` with SQLite's online backup: one read transaction, so
  // a consistent snapshot even while a coordinator writes. The copy is checked and appears at
  // `to` only when complete.
  static absl::Status Backup(const std::string& path, const std::string& to);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts a new job and its first events. ALREADY_EXISTS when the job id or a non-empty
  // request_id is taken.
  absl::Status InsertJob(const v1::Job& job, const std::vector<v1::JobEvent>& events);
  // Replaces a stored job and appends `events`, in one transaction.
  absl::Status UpdateJob(const v1::Job& job, const std::vector<v1::JobEvent>& events);
  // Every job, oldest first (the order they were inserted). A record that does not parse is
  // moved, whole, to the table jobs_set_aside (with why) and its id added to `set_aside`, so one
  // damaged record neither stops the coordinator nor disappears unnoticed.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs(std::vector<std::string>* set_aside);
  // A job's events with sequence > `after_sequence`, in order, at most `limit`.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                       int64_t after_sequence, int limit);
  // The largest event sequence of a job, 0 when it has none.
  absl::StatusOr<int64_t> LastSequence(const std::string& job_id);

  absl::Status PutWorker(const v1::WorkerInfo& worker);
  absl::StatusOr<std::vector<v1::WorkerInfo>> LoadWorkers();

  // Makes the writes made while it lives one transaction: a ReportStatus carrying a batch of
  // trainer events costs one fsync instead of one per event (which, under the coordinator's lock,
  // held up heartbeats). Nothing in it is durable before Commit(); destroyed uncommitted, it
  // rolls back. Writers must not run concurrently with it (the coordinator's lock ensures that).
  class Batch {
   public:
    explicit Batch(Store& store);
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    absl::Status Commit();

   private:
    Store& store_;
    bool open_ = false;
  };

  // For tests and diagnostics.
  absl::StatusOr<std::string> JournalMode();
  absl::StatusOr<int> SchemaVersion();
  static int LatestSchemaVersion();

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  absl::Status Migrate();
  absl::Status CheckIntegrity();
  static absl::Status DamagedError(const std::string& findings);
  absl::Status Exec(const char* sql);
  absl::Status AppendEvents(const std::vector<v1::JobEvent>& events);
  absl::Status Error(const char* what) const;

  std::mutex mu_;  // one connection, used by the coordinator and by watch/log streams
  sqlite3* const db_;
};

}  // namespace hyscale::server
