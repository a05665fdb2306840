#include "worker/trainer/events.h"

#include <absl/strings/str_cat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

namespace hyscale::trainer {
namespace {

using nlohmann::json;

constexpr auto kBarRedrawInterval = std::chrono::milliseconds(100);
constexpr int kBarWidth = 24;
constexpr char kClearLine[] = "\r\033[K";

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json event(const char* name) {
  return json{{"event", name}, {"time", unix_seconds()}};
}

// printf-style formatting of one number, e.g. format("%.4f", loss).
std::string format(const char* spec, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, spec, value);
  return buffer;
}

std::string hms(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%lld:%02d:%02d", static_cast<long long>(s / 3600),
                static_cast<int>(s / 60 % 60), static_cast<int>(s % 60));
  return buffer;
}

std::vector<std::ostream*> process_json_streams(std::ostream* file) {
  std::vector<std::ostream*> streams;
  if (file != nullptr) streams.push_back(file);
  if (!isatty(STDOUT_FILENO)) streams.push_back(&std::cout);
  return streams;
}

}  // namespace

EventSink::EventSink(std::vector<std::ostream*> json_streams, std::ostream* terminal)
    : json_streams_(std::move(json_streams)), terminal_(terminal) {}

EventSink::EventSink(std::ostream* file)
    : EventSink(process_json_streams(file), isatty(STDOUT_FILENO) ? &std::cerr : nullptr) {}

void EventSink::Emit(const std::string& json_line, const std::string& readable) {
  for (std::ostream* out : json_streams_) *out << json_line << '\n' << std::flush;
  if (terminal_ == nullptr || readable.empty()) return;
  *terminal_ << kClearLine << readable << '\n' << bar_ << std::flush;
}

void EventSink::JobStarted(const v1::JobSpec& spec, const std::string& device) {
  log_every_ = std::max(1, spec.log_every());
  int64_t total = 0;
  for (const auto& stage : spec.stages()) total += stage.steps();
  json j = event("job_started");
  j["name"] = spec.name();
  j["total_steps"] = total;
  j["device"] = device;
  // The sparse attention kernels' G (parallelism.query_group; 0: the kernels' own choice).
  j["query_group"] = spec.parallelism().query_group();
  Emit(j.dump(), absl::StrCat("job ", spec.name(), ": ", total, " steps on ", device));
}

void EventSink::StageStarted(int index, const v1::StageSpec& stage, int64_t step) {
  const std::string attention = v1::AttentionMode_Name(stage.attention());
  const std::string trains = v1::Trainable_Name(stage.trains());
  json j = event("stage_started");
  j["stage"] = index;
  j["name"] = stage.name();
  j["step"] = step;
  j["steps"] = stage.steps();
  j["attention"] = attention;
  j["trains"] = trains;
  Emit(j.dump(),
       absl::StrCat("stage ", index, " (", stage.name(), "): ", stage.steps(), " steps from step ",
                    step, ", ", attention, " attention, trains ", trains));
}

void EventSink::Step(const StepMetrics& m, int64_t total_steps) {
  const Clock::time_point now = Clock::now();
  if (!first_step_) first_step_.emplace(m.step, now);
  const int64_t steps_timed = m.step - first_step_->first;
  const double seconds_per_step =
      steps_timed > 0
          ? std::chrono::duration<double>(now - first_step_->second).count() / steps_timed
          : m.step_seconds;
  const double eta =
      seconds_per_step * static_cast<double>(std::max<int64_t>(0, total_steps - m.step));
  if (terminal_ != nullptr && (now - last_bar_ >= kBarRedrawInterval || m.step == total_steps)) {
    DrawBar(m, total_steps, eta);
    last_bar_ = now;
  }
  const bool log =
      steps_timed == 0 || m.step % log_every_ == 0 || m.eval.has_value() || m.step == total_steps;
  if (!log) return;

  json j = event("step");
  j["step"] = m.step;
  j["total_steps"] = total_steps;
  j["stage"] = m.stage;
  j["loss"] = m.loss;
  j["lm_loss"] = m.lm_loss;
  j["indexer_loss"] = m.indexer_loss;
  j["lr"] = m.lr;
  j["step_seconds"] = m.step_seconds;
  j["tokens_per_second"] = m.tokens_per_second;
  j["peak_memory_bytes"] = m.peak_memory_bytes;
  j["eta_seconds"] = eta;
  j["phase_seconds"] = m.phase_seconds;
  if (m.comm) {
    j["comm_exposed_seconds"] = m.comm->exposed_seconds;
    j["comm_overlapped_seconds"] = m.comm->overlapped_seconds;
  }
  std::string readable = absl::StrCat(
      "step ", m.step, "/", total_steps, "  loss ", format("%.4f", m.loss), " (lm ",
      format("%.4f", m.lm_loss), ", indexer ", format("%.4f", m.indexer_loss), ")  lr ",
      format("%.2e", m.lr), "  ", format("%.0f", m.tokens_per_second), " tok/s");
  if (m.eval) {
    j["accuracy"] = m.eval->accuracy;
    j["indexer_recall"] = m.eval->indexer_recall;
    absl::StrAppend(&readable, "  accuracy ", format("%.3f", m.eval->accuracy), "  indexer recall ",
                    format("%.3f", m.eval->indexer_recall));
  }
  Emit(j.dump(), readable);
}

void EventSink::DrawBar(const StepMetrics& m, int64_t total_steps, double eta_seconds) {
  const double done =
      total_steps > 0 ? std::clamp(static_cast<double>(m.step) / total_steps, 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(done * kBarWidth);
  bar_ = absl::StrCat("[", std::string(filled, '#'), std::string(kBarWidth - filled, '.'), "] ",
                      m.step, "/", total_steps, " ", format("%3.0f", 100 * done), "%  ETA ",
                      hms(eta_seconds), "  loss ", format("%.4f", m.loss), "  ",
                      format("%.0f", m.tokens_per_second), " tok/s");
  *terminal_ << kClearLine << bar_ << std::flush;
}

void EventSink::StageFinished(int index, const v1::StageSpec& stage, int64_t step) {
  json j = event("stage_finished");
  j["stage"] = index;
  j["name"] = stage.name();
  j["step"] = step;
  Emit(j.dump(), absl::StrCat("stage ", index, " (", stage.name(), ") finished at step ", step));
}

void EventSink::CheckpointWritten(int64_t step, const std::string& path) {
  json j = event("checkpoint_written");
  j["step"] = step;
  j["path"] = path;
  Emit(j.dump(), absl::StrCat("checkpoint at step ", step, ": ", path));
}

void EventSink::CheckpointLoaded(int64_t step, const std::string& path) {
  json j = event("checkpoint_loaded");
  j["step"] = step;
  j["path"] = path;
  Emit(j.dump(), absl::StrCat("resumed at step ", step, " from ", path));
}

void EventSink::Rendezvous(const std::string& address, int world_size) {
  json j = event("rendezvous");
  j["address"] = address;
  j["world_size"] = world_size;
  Emit(j.dump(), absl::StrCat("rendezvous for ", world_size, " ranks at ", address));
}

void EventSink::Warning(const std::string& message) {
  json j = event("warning");
  j["message"] = message;
  Emit(j.dump(), "warning: " + message);
}

void EventSink::JobFinished(const absl::Status& status) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  json j = event("job_finished");
  j["ok"] = status.ok();
  j["elapsed_seconds"] = elapsed;
  if (!status.ok()) j["reason"] = std::string(status.message());
  bar_.clear();  // the job is over: leave the terminal on a fresh line
  Emit(j.dump(), status.ok() ? "done in " + hms(elapsed)
                             : absl::StrCat("failed after ", hms(elapsed), ": ", status.message()));
}

}  // namespace hyscale::trainer
