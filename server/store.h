// JobStore: the coordinator's durable state in one SQLite file (<data-dir>/hyscale.db).
// Every write is a transaction with synchronous=FULL in WAL mode, so a job's transition and its
// event are on disk together before the RPC that caused them answers.
//
// New jobs can instead be staged and synced (group commit): every submission that waits for the
// disk at the same time shares one transaction and one fsync, taken by whichever of them finds
// no commit under way, so durable submissions are not limited to one fsync each.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
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
  // Group commit. StageInsert queues a new job and its first events for the next transaction
  // without writing anything. Sync(ticket) returns once that transaction is on disk (committing
  // everything staged so far when no other caller is committing) or with its error; a staged job
  // whose transaction failed is not stored. Any other write writes what is staged first, in its
  // own transaction, so a later change of a staged job never reaches the disk before the job.
  using Ticket = int64_t;
  Ticket StageInsert(v1::Job job, std::vector<v1::JobEvent> events);
  absl::Status Sync(Ticket ticket);
  // Whether the transaction holding `ticket` has committed (false while staged or after it failed).
  bool Stored(Ticket ticket);

  // Replaces a stored job and appends `events`, in one transaction.
  absl::Status UpdateJob(const v1::Job& job, const std::vector<v1::JobEvent>& events);
  // Every job, oldest first (the order they were inserted). A record that does not parse is
  // moved, whole, to the table jobs_set_aside (with why) and its id added to `set_aside`, so one
  // damaged record neither stops the coordinator nor disappears unnoticed.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs(std::vector<std::string>* set_aside);
  // A job's committed events with sequence > `after_sequence`, in order, at most `limit`. On a
  // connection of its own: it never waits for a write.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                       int64_t after_sequence, int limit);
  // The largest event sequence of a job, 0 when it has none.
  absl::StatusOr<int64_t> LastSequence(const std::string& job_id);

  // A worker and the agent instance that holds its name (its lease).
  struct StoredWorker {
    v1::WorkerInfo info;
    std::string instance;
  };
  absl::Status PutWorker(const v1::WorkerInfo& worker, const std::string& instance);
  absl::StatusOr<std::vector<StoredWorker>> LoadWorkers();

  // Makes the writes made while it lives one transaction: a ReportStatus carrying a batch of
  // trainer events costs one fsync instead of one per event (which, under the coordinator's lock,
  // held up heartbeats). Nothing in it is durable before Commit(); destroyed uncommitted, it
  // rolls back. It holds the connection for its whole life: other threads' calls wait.
  class Batch {
   public:
    explicit Batch(Store& store);
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    absl::Status Commit();

   private:
    Store& store_;
    std::unique_lock<std::recursive_mutex> hold_;
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
  absl::Status InsertRow(const v1::Job& job, const std::vector<v1::JobEvent>& events);
  bool HasStaged();
  absl::Status Error(const char* what) const;

  struct StagedInsert {
    Ticket ticket;
    v1::Job job;
    std::vector<v1::JobEvent> events;
  };
  // Runs `body` in a transaction that first writes every staged job (inside an open Batch: in the
  // batch's transaction). Called with db_mu_ held.
  absl::Status WriteTransaction(const char* what, const std::function<absl::Status()>& body);
  // Takes the staged jobs into the open transaction: they are settled when it ends.
  std::vector<StagedInsert> TakeStaged();
  // Takes them and writes them.
  absl::Status WriteStaged();
  // Ends the open transaction's hold on the jobs WriteStaged wrote: stored, or failed with
  // `status`.
  void Settle(const absl::Status& status);

  // One connection, used by the coordinator, group commits and watch/log streams. Recursive
  // because a Batch holds it while its writes take it again.
  std::recursive_mutex db_mu_;
  sqlite3* const db_;
  std::mutex reader_mu_;  // LoadEvents' read-only connection
  sqlite3* reader_ = nullptr;

  // Group commit state, under stage_mu_ (taken after db_mu_, never before it).
  std::mutex stage_mu_;
  std::condition_variable settled_;
  std::vector<StagedInsert> staged_;
  std::vector<Ticket> in_transaction_;  // written by WriteStaged, not yet settled (db_mu_)
  Ticket next_ticket_ = 1;
  Ticket settled_through_ = 0;             // every ticket up to here is stored or failed
  std::map<Ticket, absl::Status> failed_;  // the most recent failures (bounded)
  bool committing_ = false;                // a Sync is writing a group
};

}  // namespace hyscale::server
