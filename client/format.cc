#include "client/format.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/time.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "proto/constants.h"
#include "proto/events.h"
#include "proto/job_spec.h"

namespace hyscale::cli {
namespace {

constexpr char kPhaseSymbols[] = "#=+-:*~o%@";

}  // namespace

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    // C1 controls (U+0080..U+009F, e.g. CSI) are 0xC2 0x80..0x9F in UTF-8.
    const bool c1 = byte == 0xC2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (byte < 0x20 || byte == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else if (c1) {
      absl::StrAppend(&out, "\\xc2\\x",
                      absl::Hex(static_cast<unsigned char>(text[++i]), absl::kZeroPad2));
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

Table::Table(std::vector<std::string> headers) {
  rows_.push_back(std::move(headers));
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(rows_.front().size());
  for (auto& cell : cells) cell = Printable(cell);
  rows_.push_back(std::move(cells));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> widths(rows_.front().size(), 0);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
  return name.empty() ? absl::StrCat(static_cast<int>(state)) : name;
}

absl::StatusOr<v1::JobState> ParseState(const std::string& text) {
  std::string name = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(name, "JOB_STATE_")) name = "JOB_STATE_" + name;
  v1::JobState state;
  if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state: unknown job state '", text,
                     "' (pending, scheduled, running, restarting, succeeded, failed, cancelled)"));
  }
  return state;
}

std::string WorkerStateName(v1::WorkerState state) {
  std::string name = v1::WorkerState_Name(state);
  if (absl::StartsWith(name, "WORKER_STATE_")) name = name.substr(13);
  return name;
}

std::string DeviceKindName(v1::DeviceKind kind) {
  switch (kind) {
    case v1::DEVICE_KIND_CPU:
      return "cpu";
    case v1::DEVICE_KIND_GPU:
      return "gpu";
    default:
      return "any";
  }
}

absl::StatusOr<v1::DeviceKind> ParseDeviceKind(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "cpu") return v1::DEVICE_KIND_CPU;
  if (lower == "gpu") return v1::DEVICE_KIND_GPU;
  if (lower == "any" || lower.empty()) return v1::DEVICE_KIND_UNSPECIFIED;
  return absl::InvalidArgumentError(
      absl::StrCat("--device: must be cpu, gpu or any (got '", text, "')"));
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatRate(double per_second) {
  if (per_second >= 1e6) return absl::StrFormat("%.1fM", per_second / 1e6);
  if (per_second >= 1e4) return absl::StrFormat("%.1fk", per_second / 1e3);
  return absl::StrFormat("%.0f", per_second);
}

std::string FormatTimestamp(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(time.seconds()),
                          absl::UTCTimeZone());
}

std::string FormatAge(const google::protobuf::Timestamp& time, int64_t now_unix_seconds) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  const int64_t age = std::max<int64_t>(0, now_unix_seconds - time.seconds());
  if (age < 120) return absl::StrCat(age, "s");
  if (age < 2 * 3600) return absl::StrCat(age / 60, "m");
  if (age < 2 * 86400) return absl::StrCat(age / 3600, "h");
  return absl::StrCat(age / 86400, "d");
}

std::string FormatDevices(const google::protobuf::RepeatedPtrField<v1::Device>& devices) {
  std::vector<std::string> parts;
  for (const auto& device : devices) {
    parts.push_back(absl::StrCat(device.count(), "x ", device.name(), " (",
                                 FormatBytes(device.memory_bytes()), ")"));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

std::string ProgressBar(const v1::TrainerEventLine::Step& step, int width) {
  const double done =
      step.total_steps() > 0
          ? std::clamp(static_cast<double>(step.step()) / static_cast<double>(step.total_steps()),
                       0.0, 1.0)
          : 0.0;
  const int bar = std::max(width, 1);
  const int filled = static_cast<int>(done * bar);
  std::string line = absl::StrCat(
      "[", std::string(filled, '#'), std::string(bar - filled, '.'), "] ", step.step(), "/",
      step.total_steps(), "  ", absl::StrFormat("%3.0f%%", 100 * done), "  ETA ",
      FormatDuration(step.eta_seconds()), "  loss ", absl::StrFormat("%.4f", step.loss()), "  ",
      FormatRate(step.tokens_per_second()), " tok/s");
  if (step.has_evaluation()) {
    absl::StrAppend(&line, "  acc ", absl::StrFormat("%.3f", step.evaluation().accuracy()),
                    "  recall ", absl::StrFormat("%.3f", step.evaluation().indexer_recall()));
  }
  return line;
}

std::string PhaseBreakdown(const std::map<std::string, double>& phase_seconds, int width) {
  std::vector<std::pair<std::string, double>> phases;
  double total = 0;
  for (const auto& [name, seconds] : phase_seconds) {
    if (seconds <= 0) continue;
    phases.emplace_back(name, seconds);
    total += seconds;
  }
  if (phases.empty()) return "phases -";
  std::stable_sort(phases.begin(), phases.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  const size_t symbols = sizeof kPhaseSymbols - 1;
  // The trainer reports about twenty phases: the largest keep a symbol each, the rest share one.
  if (phases.size() > symbols) {
    double rest = 0;
    for (size_t i = symbols - 1; i < phases.size(); ++i) rest += phases[i].second;
    phases.resize(symbols - 1);
    phases.emplace_back("rest", rest);
  }
  std::string bar, legend;
  int used = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const char symbol = kPhaseSymbols[std::min(i, symbols - 1)];
    const double share = phases[i].second / total;
    // The last phase takes what rounding left, so the bar is always `width` wide.
    const int cells = i + 1 == phases.size()
                          ? width - used
                          : std::min(width - used, static_cast<int>(std::lround(share * width)));
    bar.append(static_cast<size_t>(std::max(cells, 0)), symbol);
    used += std::max(cells, 0);
    absl::StrAppend(&legend, "  ", std::string(1, symbol), " ", phases[i].first, " ",
                    absl::StrFormat("%.0f%%", 100 * share));
  }
  return absl::StrCat("phases [", bar, "]", legend);
}

namespace {

std::string DescribeStep(const v1::TrainerEventLine::Step& step) {
  std::string line = absl::StrCat(
      "step ", step.step(), "/", step.total_steps(), " stage ", step.stage(), "  ",
      DescribeLosses(step), "  lr ", absl::StrFormat("%.2e", step.lr()), "  ",
      FormatRate(step.tokens_per_second()), " tok/s  ETA ", FormatDuration(step.eta_seconds()));
  if (step.has_evaluation()) {
    absl::StrAppend(&line, "  accuracy ", absl::StrFormat("%.3f", step.evaluation().accuracy()),
                    "  indexer recall ",
                    absl::StrFormat("%.3f", step.evaluation().indexer_recall()));
    // One G of the key sharing: the largest query group the sparse attention kernels take.
    for (const auto& shared : step.evaluation().key_sharing()) {
      if (shared.group() != kQueryGroups[std::size(kQueryGroups) - 1]) continue;
      absl::StrAppend(&line, "  keys shared by ", shared.group(), " queries ",
                      absl::StrFormat("%.2f", shared.selected_per_distinct()), "x");
    }
  }
  return line;
}

// "<kind>: <what it says>", or the step's line.
std::string DescribeTrainerEvent(const v1::TrainerEventLine& event) {
  const std::string kind(EventKind(event));
  switch (event.kind_case()) {
    case v1::TrainerEventLine::kJobStarted:
      return absl::StrCat(kind, ": ", event.job_started().name(), ", ",
                          event.job_started().total_steps(), " steps");
    case v1::TrainerEventLine::kStageStarted: {
      const auto& stage = event.stage_started();
      return absl::StrCat(kind, ": ", stage.stage(), " (", stage.name(), "): ", stage.steps(),
                          " steps, ", v1::AttentionMode_Name(stage.attention()),
                          " attention, trains ", v1::Trainable_Name(stage.trains()),
                          stage.query_chunk() > 0
                              ? absl::StrCat(", queries in chunks of ", stage.query_chunk())
                              : "",
                          stage.predicted_memory().total_bytes() > 0
                              ? absl::StrCat(", predicted peak ",
                                             FormatBytes(stage.predicted_memory().total_bytes()))
                              : "");
    }
    case v1::TrainerEventLine::kStep:
      return DescribeStep(event.step());
    case v1::TrainerEventLine::kStageFinished: {
      const auto& stage = event.stage_finished();
      return absl::StrCat(kind, ": ", stage.stage(), " (", stage.name(), ") at step ",
                          stage.step());
    }
    case v1::TrainerEventLine::kCheckpointWritten:
      return absl::StrCat(kind, ": step ", event.checkpoint_written().step(), " ",
                          event.checkpoint_written().path());
    case v1::TrainerEventLine::kCheckpointLoaded:
      return absl::StrCat(kind, ": step ", event.checkpoint_loaded().step(), " ",
                          event.checkpoint_loaded().path());
    case v1::TrainerEventLine::kRendezvous:
      return absl::StrCat(kind, ": ", event.rendezvous().address(), " for ",
                          event.rendezvous().world_size(), " ranks");
    case v1::TrainerEventLine::kWarning:
      return absl::StrCat(kind, ": ", event.warning());
    case v1::TrainerEventLine::kJobFinished:
      return absl::StrCat(kind, ": ",
                          event.job_finished().ok()
                              ? "ok"
                              : absl::StrCat("failed: ", event.job_finished().reason()));
    case v1::TrainerEventLine::KIND_NOT_SET:
      break;
  }
  return "event of an unknown kind";
}

}  // namespace

std::string DescribeEvent(const v1::JobEvent& event) {
  const std::string when =
      event.has_time() ? absl::FormatTime("%H:%M:%S", absl::FromUnixSeconds(event.time().seconds()),
                                          absl::UTCTimeZone())
                       : "--:--:--";
  switch (event.kind_case()) {
    case v1::JobEvent::kStateChange: {
      const auto& change = event.state_change();
      // The first event of a watch restates the current state (from == to); a new job's first
      // has no previous state.
      const bool transition =
          change.from() != change.to() && change.from() != v1::JOB_STATE_UNSPECIFIED;
      std::string line = transition ? absl::StrCat(when, " state ", StateName(change.from()),
                                                   " -> ", StateName(change.to()))
                                    : absl::StrCat(when, " state ", StateName(change.to()));
      if (change.restarts() > 0) absl::StrAppend(&line, " (restart ", change.restarts(), ")");
      if (!change.reason().empty()) absl::StrAppend(&line, ": ", Printable(change.reason()));
      return line;
    }
    case v1::JobEvent::kTrainer: {
      const auto& trainer = event.trainer();
      return Printable(
          absl::StrCat(when, " rank ", trainer.rank(), " ", DescribeTrainerEvent(trainer.event())));
    }
    case v1::JobEvent::kReplanned: {
      const auto& replanned = event.replanned();
      return Printable(absl::StrCat(when, " re-planned: ", replanned.reason(), "; now CP ",
                                    std::max(1, replanned.parallelism().context_parallel()), ", G ",
                                    replanned.parallelism().query_group(), ", ",
                                    RecomputeName(replanned.recompute()), ", ",
                                    FormatBytes(replanned.memory_bytes_per_rank()), " a rank"));
    }
    default:
      return absl::StrCat(when, " event ", event.sequence());
  }
}

}  // namespace hyscale::cli
