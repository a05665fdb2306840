// Checkpoints on disk: one directory per step, root/step-00000100/, holding named files and a
// manifest.json with the step and each file's size and CRC32. A commit is atomic: the files are
// written into root/step-00000100.tmp, each file and the directory fsynced, the directory renamed
// into place and the root fsynced, so a crash leaves the whole checkpoint or none (a leftover .tmp
// directory is ignored and removed by the next commit). Loading verifies the manifest and every
// CRC; a corrupt or partial newest checkpoint is skipped with a warning and an older one used.
// One writer per root: with an attempt number, the root is fenced so that a trainer of an
// earlier attempt of the job (one a lost agent left running) cannot write over a later one's.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyscale::trainer {

class CheckpointStore {
 public:
  // Keeps the newest `keep` checkpoints (at least 1). `root` is created by the first commit.
  // `attempt` >= 0 fences the root: Claim() records it in root/ATTEMPT, and Claim and Commit fail
  // (FAILED_PRECONDITION, writing nothing) once a later attempt has claimed the root; the check
  // and the write it guards hold an exclusive lock on root/.lock. -1: no fence (a run outside the
  // service).
  CheckpointStore(std::string root, int keep, int64_t attempt = -1);

  // Takes the root for this attempt (creating it). Call before loading, so that from then on no
  // earlier attempt commits.
  absl::Status Claim();

  // Writes `files` (plain file names -> bytes; "manifest.json" is reserved) as checkpoint
  // `step`, replacing one of the same step, then deletes all but the newest `keep`. Errors name
  // the path and the OS error.
  absl::Status Commit(int64_t step, const std::map<std::string, std::string>& files);

  struct Loaded {
    int64_t step = 0;
    std::map<std::string, std::string> files;
  };
  // The newest checkpoint whose manifest and CRCs verify. Each one skipped on the way adds a line
  // to `warnings` (for the caller to log). NOT_FOUND when the root holds no checkpoint;
  // DATA_LOSS when it holds some but none verifies.
  absl::StatusOr<Loaded> LoadLatest(std::vector<std::string>* warnings) const;

  // root/step-00000100 (at least 8 digits).
  std::string PathOf(int64_t step) const;

 private:
  std::vector<int64_t> Steps() const;  // committed step directories, newest first
  absl::StatusOr<Loaded> Load(int64_t step) const;
  void RemoveLeftoverTemporaries() const;
  // With the lock held: refuses when a later attempt holds the root, else records this one.
  absl::Status TakeFence();

  const std::string root_;
  const int keep_;
  const int64_t attempt_;
};

}  // namespace hyscale::trainer
