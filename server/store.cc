#include "server/store.h"

#include <absl/strings/str_cat.h>
#include <sqlite3.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace hyscale::server {
namespace {

// Ordered migrations: entry i brings the schema from version i to version i + 1. Never edit a
// shipped entry; append a new one.
constexpr const char* kMigrations[] = {
    // 1: jobs, their events and the workers. `seq` orders jobs by submission (FIFO, newest-first
    // listing); request_id is NULL when the client gave none, so it stays unique only when set.
    R"sql(
      CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        request_id TEXT UNIQUE,
        state INTEGER NOT NULL,
        priority INTEGER NOT NULL,
        job BLOB NOT NULL);
      CREATE TABLE job_events (
        job_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        event BLOB NOT NULL,
        PRIMARY KEY (job_id, sequence));
      CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        worker BLOB NOT NULL);
    )sql",
    // 2: job records that could not be read when loaded, kept for a person to look at.
    R"sql(
      CREATE TABLE jobs_set_aside (
        seq INTEGER NOT NULL,
        id TEXT NOT NULL,
        job BLOB,
        reason TEXT NOT NULL,
        set_aside_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP);
    )sql",
    // 3: the agent instance holding each worker's name, so the lease survives a coordinator
    // restart (kept out of the WorkerInfo record, which ListWorkers shows).
    R"sql(
      ALTER TABLE workers ADD COLUMN instance TEXT NOT NULL DEFAULT '';
    )sql",
};

constexpr int kBusyTimeoutMs = 5000;
// Failed group-commit tickets remembered for Sync and Stored: their submitters ask at once.
constexpr size_t kFailedTicketsKept = 4096;

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  void Bind(int index, const std::string& text) {
    sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int index, const std::string& bytes) {
    sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  }
  void BindNull(int index) { sqlite3_bind_null(stmt_, index); }
  void Bind(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return rc_ = sqlite3_step(stmt_); }
  int64_t Int(int column) { return sqlite3_column_int64(stmt_, column); }
  std::string Blob(int column) {
    const void* data = sqlite3_column_blob(stmt_, column);
    return std::string(static_cast<const char*>(data), sqlite3_column_bytes(stmt_, column));
  }
  std::string Text(int column) {
    const unsigned char* data = sqlite3_column_text(stmt_, column);
    return data == nullptr ? std::string() : reinterpret_cast<const char*>(data);
  }
  int rc() const { return rc_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// Rolls back unless committed, so an error path never leaves a transaction open (migrations and
// setting records aside, when nothing is staged). Inside a transaction it is part of it.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db), nested_(sqlite3_get_autocommit(db) == 0) {
    ok_ = nested_ || sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  ~Transaction() {
    if (ok_ && !nested_ && !committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  bool ok() const { return ok_; }
  bool Commit() {
    committed_ = nested_ || sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK;
    return committed_;
  }

 private:
  sqlite3* db_;
  const bool nested_;
  bool ok_ = false;
  bool committed_ = false;
};

}  // namespace

int Store::LatestSchemaVersion() {
  return static_cast<int>(std::size(kMigrations));
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat(path, ": cannot open database: ", message));
  }
  std::unique_ptr<Store> store(new Store(db));
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  for (const char* pragma :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON"}) {
    if (auto status = store->Exec(pragma); !status.ok()) {
      return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
    }
  }
  if (auto status = store->CheckIntegrity(); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  auto mode = store->JournalMode();
  if (!mode.ok()) return mode.status();
  if (*mode != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": WAL journal mode unavailable (got ", *mode, ")"));
  }
  if (auto status = store->Migrate(); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  // Watch streams read events on a connection of their own: in WAL mode it reads the last commit
  // while a write (and its fsync) holds the other.
  if (sqlite3_open_v2(path.c_str(), &store->reader_, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot open for reading: ", sqlite3_errmsg(store->reader_)));
  }
  sqlite3_busy_timeout(store->reader_, kBusyTimeoutMs);
  return store;
}

Store::~Store() {
  sqlite3_close(reader_);
  sqlite3_close(db_);
}

absl::Status Store::Error(const char* what) const {
  return absl::InternalError(absl::StrCat(what, ": ", sqlite3_errmsg(db_)));
}

absl::Status Store::CheckIntegrity() {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  Statement check(db_, "PRAGMA integrity_check(20)");
  if (!check.ok()) return DamagedError(sqlite3_errmsg(db_));
  std::string findings;
  while (check.Step() == SQLITE_ROW) {
    const std::string line = check.Text(0);
    if (line != "ok") absl::StrAppend(&findings, findings.empty() ? "" : "; ", line);
  }
  if (check.rc() != SQLITE_DONE) return DamagedError(sqlite3_errmsg(db_));
  if (!findings.empty()) return DamagedError(findings);
  return absl::OkStatus();
}

absl::Status Store::DamagedError(const std::string& findings) {
  return absl::FailedPreconditionError(absl::StrCat(
      "integrity check failed (", findings,
      "): the database is damaged and is not served; restore a backup (hyscaled backup) or move "
      "it aside to start empty"));
}

absl::Status Store::Backup(const std::string& path, const std::string& to) {
  sqlite3* source = nullptr;
  if (sqlite3_open_v2(path.c_str(), &source, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string message = source != nullptr ? sqlite3_errmsg(source) : "cannot open";
    sqlite3_close(source);
    return absl::UnavailableError(absl::StrCat(path, ": ", message));
  }
  sqlite3_busy_timeout(source, kBusyTimeoutMs);
  const std::string partial = to + ".partial";
  std::remove(partial.c_str());
  sqlite3* copy = nullptr;
  absl::Status status;
  if (sqlite3_open(partial.c_str(), &copy) != SQLITE_OK) {
    status = absl::UnavailableError(absl::StrCat(partial, ": ", sqlite3_errmsg(copy)));
  } else if (sqlite3_backup* backup = sqlite3_backup_init(copy, "main", source, "main");
             backup == nullptr) {
    status = absl::InternalError(absl::StrCat("backup: ", sqlite3_errmsg(copy)));
  } else {
    // All pages in one step: one read transaction on the source, so one consistent snapshot.
    int rc;
    while ((rc = sqlite3_backup_step(backup, -1)) == SQLITE_BUSY || rc == SQLITE_LOCKED) {
      sqlite3_sleep(50);
    }
    sqlite3_backup_finish(backup);
    if (rc != SQLITE_DONE) {
      status = absl::InternalError(absl::StrCat("backup: ", sqlite3_errstr(rc)));
    }
  }
  sqlite3_close(copy);
  sqlite3_close(source);
  if (status.ok()) {
    // Checked before it replaces anything at `to`.
    auto checked = Open(partial);
    if (!checked.ok()) status = checked.status();
  }
  if (status.ok() && std::rename(partial.c_str(), to.c_str()) != 0) {
    status = absl::InternalError(absl::StrCat(to, ": cannot write: ", std::strerror(errno)));
  }
  if (!status.ok()) std::remove(partial.c_str());
  return status;
}

absl::Status Store::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message != nullptr ? message : "unknown error";
    sqlite3_free(message);
    return absl::InternalError(absl::StrCat("sqlite: ", text));
  }
  return absl::OkStatus();
}

absl::Status Store::Migrate() {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  Transaction tx(db_);
  if (!tx.ok()) return Error("begin migration");
  if (auto s = Exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)");
      !s.ok()) {
    return s;
  }
  int version = 0;
  {
    Statement select(db_, "SELECT version FROM schema_version");
    if (!select.ok()) return Error("read schema_version");
    if (select.Step() == SQLITE_ROW) {
      version = static_cast<int>(select.Int(0));
    } else if (auto s = Exec("INSERT INTO schema_version (version) VALUES (0)"); !s.ok()) {
      return s;
    }
  }
  if (version > LatestSchemaVersion()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schema version ", version, " is newer than this hyscaled (", LatestSchemaVersion(), ")"));
  }
  for (; version < LatestSchemaVersion(); ++version) {
    if (auto s = Exec(kMigrations[version]); !s.ok()) {
      return absl::InternalError(absl::StrCat("migration ", version + 1, ": ", s.message()));
    }
    Statement update(db_, "UPDATE schema_version SET version = ?");
    update.Bind(1, int64_t{version + 1});
    if (update.Step() != SQLITE_DONE) return Error("write schema_version");
  }
  if (!tx.Commit()) return Error("commit migration");
  return absl::OkStatus();
}

absl::StatusOr<int> Store::SchemaVersion() {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  Statement select(db_, "SELECT version FROM schema_version");
  if (!select.ok() || select.Step() != SQLITE_ROW) return Error("read schema_version");
  return static_cast<int>(select.Int(0));
}

absl::StatusOr<std::string> Store::JournalMode() {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  Statement select(db_, "PRAGMA journal_mode");
  if (!select.ok() || select.Step() != SQLITE_ROW) return Error("read journal_mode");
  return select.Text(0);
}

absl::Status Store::AppendEvents(const std::vector<v1::JobEvent>& events) {
  for (const auto& event : events) {
    Statement insert(db_, "INSERT INTO job_events (job_id, sequence, event) VALUES (?, ?, ?)");
    insert.Bind(1, event.job_id());
    insert.Bind(2, event.sequence());
    insert.BindBlob(3, event.SerializeAsString());
    if (insert.Step() != SQLITE_DONE) return Error("insert job event");
  }
  return absl::OkStatus();
}

absl::Status Store::InsertRow(const v1::Job& job, const std::vector<v1::JobEvent>& events) {
  {
    Statement insert(
        db_, "INSERT INTO jobs (id, request_id, state, priority, job) VALUES (?, ?, ?, ?, ?)");
    insert.Bind(1, job.id());
    if (job.request_id().empty()) {
      insert.BindNull(2);
    } else {
      insert.Bind(2, job.request_id());
    }
    insert.Bind(3, int64_t{job.state()});
    insert.Bind(4, int64_t{job.priority()});
    insert.BindBlob(5, job.SerializeAsString());
    const int rc = insert.Step();
    if (rc == SQLITE_CONSTRAINT) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", job.id(), " or request_id '", job.request_id(), "' exists"));
    }
    if (rc != SQLITE_DONE) return Error("insert job");
  }
  return AppendEvents(events);
}

absl::Status Store::InsertJob(const v1::Job& job, const std::vector<v1::JobEvent>& events) {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  return WriteTransaction("insert job", [&] { return InsertRow(job, events); });
}

absl::Status Store::UpdateJob(const v1::Job& job, const std::vector<v1::JobEvent>& events) {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  return WriteTransaction("update job", [&] {
    Statement update(db_, "UPDATE jobs SET state = ?, priority = ?, job = ? WHERE id = ?");
    update.Bind(1, int64_t{job.state()});
    update.Bind(2, int64_t{job.priority()});
    update.BindBlob(3, job.SerializeAsString());
    update.Bind(4, job.id());
    if (update.Step() != SQLITE_DONE) return Error("update job");
    if (sqlite3_changes(db_) != 1) return absl::NotFoundError("job " + job.id() + " not stored");
    return AppendEvents(events);
  });
}

Store::Ticket Store::StageInsert(v1::Job job, std::vector<v1::JobEvent> events) {
  std::lock_guard<std::mutex> lock(stage_mu_);
  const Ticket ticket = next_ticket_++;
  staged_.push_back({ticket, std::move(job), std::move(events)});
  return ticket;
}

absl::Status Store::Sync(Ticket ticket) {
  std::unique_lock<std::mutex> stage(stage_mu_);
  while (settled_through_ < ticket) {
    if (committing_) {
      settled_.wait(stage);
      continue;
    }
    // Everything staged until now goes in this one transaction; those who stage meanwhile wait
    // for it and then commit together.
    committing_ = true;
    stage.unlock();
    {
      std::lock_guard<std::recursive_mutex> lock(db_mu_);
      // Another write may have taken the staged jobs while this waited for the connection.
      if (HasStaged()) {
        (void)WriteTransaction("group commit", [] { return absl::OkStatus(); });
      }
    }
    stage.lock();
    committing_ = false;
    settled_.notify_all();
  }
  const auto failed = failed_.find(ticket);
  return failed == failed_.end() ? absl::OkStatus() : failed->second;
}

bool Store::Stored(Ticket ticket) {
  std::lock_guard<std::mutex> lock(stage_mu_);
  return ticket <= settled_through_ && failed_.count(ticket) == 0;
}

bool Store::HasStaged() {
  std::lock_guard<std::mutex> lock(stage_mu_);
  return !staged_.empty();
}

std::vector<Store::StagedInsert> Store::TakeStaged() {
  std::vector<StagedInsert> staged;
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    staged.swap(staged_);
  }
  for (const StagedInsert& insert : staged) in_transaction_.push_back(insert.ticket);
  return staged;
}

absl::Status Store::WriteStaged() {
  for (const StagedInsert& insert : TakeStaged()) {
    if (auto status = InsertRow(insert.job, insert.events); !status.ok()) return status;
  }
  return absl::OkStatus();
}

void Store::Settle(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(stage_mu_);
  for (const Ticket ticket : in_transaction_) {
    if (!status.ok()) failed_[ticket] = status;
    settled_through_ = std::max(settled_through_, ticket);
  }
  in_transaction_.clear();
  while (failed_.size() > kFailedTicketsKept) failed_.erase(failed_.begin());
  settled_.notify_all();
}

absl::Status Store::WriteTransaction(const char* what, const std::function<absl::Status()>& body) {
  if (sqlite3_get_autocommit(db_) == 0) {  // inside a Batch: its commit settles the staged jobs
    if (auto status = WriteStaged(); !status.ok()) return status;
    return body();
  }
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    // The staged jobs fail with it rather than wait: their submitters are answered now.
    const absl::Status error = Error(what);
    TakeStaged();
    Settle(error);
    return error;
  }
  absl::Status staged = WriteStaged();
  absl::Status written = staged;
  if (staged.ok()) {
    // A failing body (an update of a job that is not stored) must not take the staged jobs down
    // with it.
    Exec("SAVEPOINT body").IgnoreError();
    written = body();
    if (!written.ok()) Exec("ROLLBACK TO body").IgnoreError();
    Exec("RELEASE body").IgnoreError();
  }
  if (staged.ok() && sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    staged = Error(absl::StrCat("commit ", what).c_str());
    written = staged;
  }
  if (!staged.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  Settle(staged);
  return written;
}

absl::StatusOr<std::vector<v1::Job>> Store::LoadJobs(std::vector<std::string>* set_aside) {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  std::vector<v1::Job> jobs;
  std::vector<int64_t> unreadable;  // seq of each record that does not parse
  {
    Statement select(db_, "SELECT seq, id, job FROM jobs ORDER BY seq");
    if (!select.ok()) return Error("load jobs");
    int rc;
    while ((rc = select.Step()) == SQLITE_ROW) {
      v1::Job job;
      if (!job.ParseFromString(select.Blob(2)) || job.id() != select.Text(1)) {
        unreadable.push_back(select.Int(0));
        set_aside->push_back(select.Text(1));
        continue;
      }
      jobs.push_back(std::move(job));
    }
    if (rc != SQLITE_DONE) return Error("load jobs");
  }
  for (const int64_t seq : unreadable) {
    Transaction tx(db_);
    if (!tx.ok()) return Error("begin set aside");
    Statement move(
        db_,
        "INSERT INTO jobs_set_aside (seq, id, job, reason) SELECT seq, id, job, "
        "'the stored record does not parse as a hyscale.v1.Job' FROM jobs WHERE seq = ?");
    move.Bind(1, seq);
    if (move.Step() != SQLITE_DONE) return Error("set aside job");
    Statement remove(db_, "DELETE FROM jobs WHERE seq = ?");
    remove.Bind(1, seq);
    if (remove.Step() != SQLITE_DONE) return Error("set aside job");
    if (!tx.Commit()) return Error("commit set aside");
  }
  return jobs;
}

absl::StatusOr<std::vector<v1::JobEvent>> Store::LoadEvents(const std::string& job_id,
                                                            int64_t after_sequence, int limit) {
  std::lock_guard<std::mutex> lock(reader_mu_);
  const auto error = [&] {
    return absl::InternalError(absl::StrCat("load events: ", sqlite3_errmsg(reader_)));
  };
  Statement select(reader_,
                   "SELECT event FROM job_events WHERE job_id = ? AND sequence > ? "
                   "ORDER BY sequence LIMIT ?");
  if (!select.ok()) return error();
  select.Bind(1, job_id);
  select.Bind(2, after_sequence);
  select.Bind(3, int64_t{limit});
  std::vector<v1::JobEvent> events;
  int rc;
  while ((rc = select.Step()) == SQLITE_ROW) {
    v1::JobEvent event;
    if (!event.ParseFromString(select.Blob(0))) {
      return absl::DataLossError("job " + job_id + ": stored event does not parse");
    }
    events.push_back(std::move(event));
  }
  if (rc != SQLITE_DONE) return error();
  return events;
}

absl::StatusOr<int64_t> Store::LastSequence(const std::string& job_id) {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  Statement select(db_, "SELECT COALESCE(MAX(sequence), 0) FROM job_events WHERE job_id = ?");
  if (!select.ok()) return Error("last sequence");
  select.Bind(1, job_id);
  if (select.Step() != SQLITE_ROW) return Error("last sequence");
  return select.Int(0);
}

absl::Status Store::PutWorker(const v1::WorkerInfo& worker, const std::string& instance) {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  return WriteTransaction("put worker", [&] {
    Statement upsert(db_,
                     "INSERT INTO workers (id, worker, instance) VALUES (?, ?, ?) "
                     "ON CONFLICT (id) DO UPDATE SET worker = excluded.worker, "
                     "instance = excluded.instance");
    if (!upsert.ok()) return Error("put worker");
    upsert.Bind(1, worker.id());
    upsert.BindBlob(2, worker.SerializeAsString());
    upsert.Bind(3, instance);
    if (upsert.Step() != SQLITE_DONE) return Error("put worker");
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<Store::StoredWorker>> Store::LoadWorkers() {
  std::lock_guard<std::recursive_mutex> lock(db_mu_);
  Statement select(db_, "SELECT id, worker, instance FROM workers ORDER BY id");
  if (!select.ok()) return Error("load workers");
  std::vector<StoredWorker> workers;
  int rc;
  while ((rc = select.Step()) == SQLITE_ROW) {
    StoredWorker worker;
    if (!worker.info.ParseFromString(select.Blob(1))) {
      return absl::DataLossError("worker " + select.Text(0) + ": stored record does not parse");
    }
    worker.instance = select.Text(2);
    workers.push_back(std::move(worker));
  }
  if (rc != SQLITE_DONE) return Error("load workers");
  return workers;
}

Store::Batch::Batch(Store& store) : store_(store), hold_(store.db_mu_) {
  open_ = sqlite3_exec(store_.db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
}

Store::Batch::~Batch() {
  if (!open_) return;
  sqlite3_exec(store_.db_, "ROLLBACK", nullptr, nullptr, nullptr);
  store_.Settle(absl::AbortedError("the batch it was written in was rolled back"));
}

absl::Status Store::Batch::Commit() {
  if (!open_) return store_.Error("begin batch");
  open_ = false;
  absl::Status status;
  if (sqlite3_exec(store_.db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    status = store_.Error("commit batch");
    sqlite3_exec(store_.db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  store_.Settle(status);
  return status;
}

}  // namespace hyscale::server
