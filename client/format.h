// Text for people: aligned tables, durations, sizes, and the watch view's progress bar, phase
// breakdown and event lines. Pure functions of their inputs, so they are tested directly.
#pragma once

#include <absl/status/statusor.h>
#include <google/protobuf/timestamp.pb.h>

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "hyscale/v1/service.pb.h"

namespace hyscale::cli {

// Columns padded to their widest cell, separated by two spaces; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  void AddRow(std::vector<std::string> cells);
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;  // headers first
};

// `text` safe for a terminal: control characters (C0, DEL, C1) as \xNN, so a job name or reason
// cannot move the cursor, recolour or retitle the user's terminal. Other UTF-8 passes as is.
std::string Printable(std::string_view text);

std::string StateName(v1::JobState state);  // "RUNNING"
// Accepts "running", "RUNNING" or "JOB_STATE_RUNNING"; errors name the flag.
absl::StatusOr<v1::JobState> ParseState(const std::string& text);
std::string WorkerStateName(v1::WorkerState state);  // "ONLINE"
std::string DeviceKindName(v1::DeviceKind kind);     // "cpu", "gpu", "any"
absl::StatusOr<v1::DeviceKind> ParseDeviceKind(const std::string& text);

std::string FormatDuration(double seconds);  // "0:01:23", "12:00:00"; "-" when negative
std::string FormatBytes(int64_t bytes);      // "512 B", "1.5 KiB", "141.0 GiB"
std::string FormatRate(double per_second);   // "950", "12.3k", "1.2M"
std::string FormatTimestamp(const google::protobuf::Timestamp& time);  // RFC 3339 UTC, "-" unset
// How long before `now_unix_seconds`: "42s", "5m", "3h", "2d"; "-" when unset.
std::string FormatAge(const google::protobuf::Timestamp& time, int64_t now_unix_seconds);
std::string FormatDevices(const google::protobuf::RepeatedPtrField<v1::Device>& devices);

// "[##########..........] 120/1000  12%  ETA 0:01:23  loss 2.3456  12.3k tok/s"
std::string ProgressBar(const v1::TrainerEventLine::Step& step, int width);
// "phases [####====++-] # selection 40%  = attention_fwd 30%  + data 20%  - other 10%":
// one symbol per phase, biggest first, the bar `width` wide.
std::string PhaseBreakdown(const std::map<std::string, double>& phase_seconds, int width);
// One readable line per job event, for logs and non-terminal output.
std::string DescribeEvent(const v1::JobEvent& event);

}  // namespace hyscale::cli
