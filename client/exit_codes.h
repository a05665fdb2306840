// The hyscale CLI's exit codes, one per kind of outcome so scripts can branch on them:
//   0  ok (for watch, submit --watch and up -f: the job SUCCEEDED)
//   1  the job FAILED or was CANCELLED
//   2  usage error or invalid argument (bad flags, unreadable or invalid job spec)
//   3  not found (unknown job id)
//   4  unauthenticated or permission denied (missing or wrong token)
//   5  coordinator unavailable or the call timed out
//   6  conflict: the job's state forbids it, or the request id was used for another request
//   7  any other error (internal, a child process of `up` failed)
#pragma once

#include <absl/status/status.h>
#include <grpcpp/grpcpp.h>

#include "proto/constants.h"

namespace hyscale::cli {

enum ExitCode : int {
  kExitOk = hyscale::kExitOk,
  kExitJobFailed = 1,
  kExitUsage = hyscale::kExitBadInput,
  kExitNotFound = 3,
  kExitUnauthenticated = 4,
  kExitUnavailable = 5,
  kExitConflict = 6,
  kExitError = 7,
};

// The table above, for `hyscale --help`.
extern const char kExitCodeHelp[];

ExitCode ExitCodeFor(absl::StatusCode code);
inline ExitCode ExitCodeFor(const absl::Status& status) {
  return ExitCodeFor(status.code());
}
inline ExitCode ExitCodeFor(const grpc::Status& status) {
  return ExitCodeFor(static_cast<absl::StatusCode>(status.error_code()));
}

}  // namespace hyscale::cli
