// Log lines of the daemons (hyscaled, hyscale-worker) on stderr, with a time and a level:
//   2026-02-01T10:00:00.123Z INFO hyscale-worker: registered as w1 with 127.0.0.1:50051
// (UTC, milliseconds; the program's name as it was started). Each line is written with one
// write(2), so lines from several threads never interleave. Debian 12's abseil (20220623) has no
// absl/log, hence this. What a command prints for its user (the CLI's output) is not logging.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>

#include <string>

namespace hyscale::util {

enum class LogLevel { kInfo, kWarning, kError };

// Lines below `level` ("info", "warning" or "error", any case) are dropped from now on (default:
// info, all of them). INVALID_ARGUMENT for another name.
absl::Status SetMinLogLevel(absl::string_view level);

// The line Log writes, newline included.
std::string FormatLogLine(absl::Time time, LogLevel level, absl::string_view program,
                          absl::string_view message);

// Writes one line for `message` unless its level is below the minimum.
void Log(LogLevel level, absl::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) {
  Log(LogLevel::kInfo, absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  Log(LogLevel::kWarning, absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  Log(LogLevel::kError, absl::StrCat(args...));
}

}  // namespace hyscale::util
