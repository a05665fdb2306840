#include "util/log.h"

#include <absl/strings/match.h>
#include <errno.h>
#include <unistd.h>

#include <atomic>

namespace hyscale::util {
namespace {

std::atomic<LogLevel> min_level{LogLevel::kInfo};

// By LogLevel's value.
constexpr absl::string_view kLevelNames[] = {"INFO", "WARNING", "ERROR"};

absl::string_view NameOf(LogLevel level) {
  return kLevelNames[static_cast<int>(level)];
}

}  // namespace

absl::Status SetMinLogLevel(absl::string_view level) {
  for (LogLevel known : {LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (absl::EqualsIgnoreCase(level, NameOf(known))) {
      min_level.store(known);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level: info, warning or error (got '", level, "')"));
}

std::string FormatLogLine(absl::Time time, LogLevel level, absl::string_view program,
                          absl::string_view message) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()), " ",
                      NameOf(level), " ", program, ": ", message, "\n");
}

void Log(LogLevel level, absl::string_view message) {
  if (level < min_level.load()) return;
  const std::string line =
      FormatLogLine(absl::Now(), level, program_invocation_short_name, message);
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report it
    done += static_cast<size_t>(n);
  }
}

}  // namespace hyscale::util
