#include "client/exit_codes.h"

namespace hyscale::cli {

const char kExitCodeHelp[] =
    "Exit codes:\n"
    "  0  ok (watch, submit --watch, up -f: the job succeeded)\n"
    "  1  the job failed or was cancelled\n"
    "  2  usage error or invalid argument (flags, job spec)\n"
    "  3  not found\n"
    "  4  unauthenticated or permission denied\n"
    "  5  coordinator unavailable or timed out\n"
    "  6  conflict (job state forbids it, request id reused)\n"
    "  7  other error\n";

ExitCode ExitCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kExitUnauthenticated;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return kExitConflict;
    default:
      return kExitError;
  }
}

}  // namespace hyscale::cli
