#include "worker/trainer/events.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "proto/events.h"

namespace hyscale::trainer {
namespace {

constexpr auto kBarRedrawInterval = std::chrono::milliseconds(100);
constexpr int kBarWidth = 24;
constexpr char kClearLine[] = "\r\033[K";

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
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

void EventSink::Emit(v1::TrainerEventLine event, const std::string& readable) {
  event.set_time(unix_seconds());
  const auto line = FormatEventLine(event);
  if (line.ok()) {
    for (std::ostream* out : json_streams_) *out << *line << '\n' << std::flush;
  } else {
    std::cerr << "hyscale-train: cannot write a " << EventKind(event)
              << " event: " << line.status().message() << "\n";
  }
  if (terminal_ == nullptr || readable.empty()) return;
  *terminal_ << kClearLine << readable << '\n' << bar_ << std::flush;
}

void EventSink::JobStarted(const v1::JobSpec& spec, const std::string& device) {
  log_every_ = std::max(1, spec.log_every());
  int64_t total = 0;
  for (const auto& stage : spec.stages()) total += stage.steps();
  v1::TrainerEventLine event;
  auto* started = event.mutable_job_started();
  started->set_name(spec.name());
  started->set_total_steps(total);
  started->set_device(device);
  started->set_query_group(spec.parallelism().query_group());
  Emit(std::move(event), absl::StrCat("job ", spec.name(), ": ", total, " steps on ", device));
}

void EventSink::StageStarted(int index, const v1::StageSpec& stage, int64_t step,
                             int64_t query_chunk,
                             const v1::TrainerEventLine::MemoryPrediction& memory) {
  const std::string attention = v1::AttentionMode_Name(stage.attention());
  const std::string trains = v1::Trainable_Name(stage.trains());
  v1::TrainerEventLine event;
  auto* started = event.mutable_stage_started();
  started->set_stage(index);
  started->set_name(stage.name());
  started->set_step(step);
  started->set_steps(stage.steps());
  started->set_attention(stage.attention());
  started->set_trains(stage.trains());
  started->set_query_chunk(query_chunk);
  if (memory.total_bytes() > 0) *started->mutable_predicted_memory() = memory;
  Emit(std::move(event),
       absl::StrCat("stage ", index, " (", stage.name(), "): ", stage.steps(), " steps from step ",
                    step, ", ", attention, " attention, trains ", trains,
                    query_chunk > 0 ? absl::StrCat(", queries in chunks of ", query_chunk) : "",
                    memory.total_bytes() > 0
                        ? absl::StrFormat(", predicted peak %.1f GiB",
                                          static_cast<double>(memory.total_bytes()) / (1 << 30))
                        : ""));
}

void EventSink::Step(StepEvent step, int64_t total_steps) {
  const Clock::time_point now = Clock::now();
  if (!first_step_) first_step_.emplace(step.step(), now);
  const int64_t steps_timed = step.step() - first_step_->first;
  const double seconds_per_step =
      steps_timed > 0
          ? std::chrono::duration<double>(now - first_step_->second).count() / steps_timed
          : step.step_seconds();
  step.set_total_steps(total_steps);
  step.set_eta_seconds(seconds_per_step *
                       static_cast<double>(std::max<int64_t>(0, total_steps - step.step())));
  const bool last = step.step() == total_steps;
  if (terminal_ != nullptr && (now - last_bar_ >= kBarRedrawInterval || last)) {
    DrawBar(step);
    last_bar_ = now;
  }
  const bool log =
      steps_timed == 0 || step.step() % log_every_ == 0 || step.has_evaluation() || last;
  if (!log) return;

  std::string readable = absl::StrCat("step ", step.step(), "/", total_steps, "  ",
                                      DescribeLosses(step), "  lr ", format("%.2e", step.lr()),
                                      "  ", format("%.0f", step.tokens_per_second()), " tok/s");
  if (step.has_evaluation()) {
    const auto& evaluation = step.evaluation();
    absl::StrAppend(&readable, "  accuracy ", format("%.3f", evaluation.accuracy()),
                    "  indexer recall ", format("%.3f", evaluation.indexer_recall()));
    if (evaluation.key_sharing_size() > 0) {
      // "keys shared G2/4/../64 1.03/1.10/../4.06x": each G's selected keys over distinct ones.
      std::vector<std::string> groups, ratios;
      for (const auto& shared : evaluation.key_sharing()) {
        groups.push_back(absl::StrCat(shared.group()));
        ratios.push_back(format("%.2f", shared.selected_per_distinct()));
      }
      absl::StrAppend(&readable, "  keys shared G", absl::StrJoin(groups, "/"), " ",
                      absl::StrJoin(ratios, "/"), "x");
    }
  }
  v1::TrainerEventLine event;
  *event.mutable_step() = std::move(step);
  Emit(std::move(event), readable);
}

void EventSink::DrawBar(const StepEvent& step) {
  const int64_t total = step.total_steps();
  const double done =
      total > 0 ? std::clamp(static_cast<double>(step.step()) / total, 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(done * kBarWidth);
  bar_ = absl::StrCat("[", std::string(filled, '#'), std::string(kBarWidth - filled, '.'), "] ",
                      step.step(), "/", total, " ", format("%3.0f", 100 * done), "%  ETA ",
                      hms(step.eta_seconds()), "  loss ", format("%.4f", step.loss()), "  ",
                      format("%.0f", step.tokens_per_second()), " tok/s");
  *terminal_ << kClearLine << bar_ << std::flush;
}

void EventSink::StageFinished(int index, const v1::StageSpec& stage, int64_t step) {
  v1::TrainerEventLine event;
  auto* finished = event.mutable_stage_finished();
  finished->set_stage(index);
  finished->set_name(stage.name());
  finished->set_step(step);
  Emit(std::move(event),
       absl::StrCat("stage ", index, " (", stage.name(), ") finished at step ", step));
}

void EventSink::CheckpointWritten(int64_t step, const std::string& path) {
  v1::TrainerEventLine event;
  event.mutable_checkpoint_written()->set_step(step);
  event.mutable_checkpoint_written()->set_path(path);
  Emit(std::move(event), absl::StrCat("checkpoint at step ", step, ": ", path));
}

void EventSink::CheckpointLoaded(int64_t step, const std::string& path) {
  v1::TrainerEventLine event;
  event.mutable_checkpoint_loaded()->set_step(step);
  event.mutable_checkpoint_loaded()->set_path(path);
  Emit(std::move(event), absl::StrCat("resumed at step ", step, " from ", path));
}

void EventSink::Rendezvous(const std::string& address, int world_size) {
  v1::TrainerEventLine event;
  event.mutable_rendezvous()->set_address(address);
  event.mutable_rendezvous()->set_world_size(world_size);
  Emit(std::move(event), absl::StrCat("rendezvous for ", world_size, " ranks at ", address));
}

void EventSink::Warning(const std::string& message) {
  v1::TrainerEventLine event;
  event.set_warning(message);
  Emit(std::move(event), "warning: " + message);
}

void EventSink::JobFinished(const absl::Status& status) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  v1::TrainerEventLine event;
  auto* finished = event.mutable_job_finished();
  finished->set_ok(status.ok());
  finished->set_elapsed_seconds(elapsed);
  finished->set_reason(std::string(status.message()));
  bar_.clear();  // the job is over: leave the terminal on a fresh line
  Emit(std::move(event), status.ok()
                             ? "done in " + hms(elapsed)
                             : absl::StrCat("failed after ", hms(elapsed), ": ", status.message()));
}

}  // namespace hyscale::trainer
