// What hyscale-train reports: one JSON line per event (hyscale.v1.TrainerEventLine, the worker
// agent's protocol, and a record in files; proto/hyscale/v1/events.proto says what each kind
// carries) and, for a person at a terminal, a progress bar with ETA redrawn in place plus a
// readable line per event.
#pragma once

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "hyscale/v1/events.pb.h"
#include "hyscale/v1/job.pb.h"

namespace hyscale::trainer {

// A step's figures as the trainer measured them; Step() adds total_steps and eta_seconds.
using StepEvent = v1::TrainerEventLine::Step;

class EventSink {
 public:
  // JSON lines go to each of `json_streams`; when `terminal` is non-null, the progress bar and
  // readable lines go there.
  EventSink(std::vector<std::ostream*> json_streams, std::ostream* terminal);

  // hyscale-train's outputs: JSON lines to `file` (if non-null) and to stdout -- unless stdout is a
  // terminal, in which case stderr gets the progress bar and readable lines instead.
  explicit EventSink(std::ostream* file);

  void JobStarted(const v1::JobSpec& spec, const std::string& device);
  // query_chunk: the queries a layer runs at once in the stage (0: all); `memory`: the planner's
  // prediction of a step's memory.
  void StageStarted(int index, const v1::StageSpec& stage, int64_t step, int64_t query_chunk = 0,
                    const v1::TrainerEventLine::MemoryPrediction& memory = {});
  // Call every step: the bar follows every step, a step event is written on the first step seen,
  // every spec.log_every steps, after an evaluation and on the last step.
  void Step(StepEvent step, int64_t total_steps);
  void StageFinished(int index, const v1::StageSpec& stage, int64_t step);
  void CheckpointWritten(int64_t step, const std::string& path);
  void CheckpointLoaded(int64_t step, const std::string& path);
  void Rendezvous(const std::string& address, int world_size);
  void Warning(const std::string& message);
  void JobFinished(const absl::Status& status);

 private:
  using Clock = std::chrono::steady_clock;

  // Writes `event`, stamped with the time, as one JSON line and, on the terminal, `readable` (if
  // not empty) above the bar.
  void Emit(v1::TrainerEventLine event, const std::string& readable);
  void DrawBar(const StepEvent& step);

  const std::vector<std::ostream*> json_streams_;
  std::ostream* const terminal_;
  int log_every_ = 10;
  const Clock::time_point started_ = Clock::now();
  std::optional<std::pair<int64_t, Clock::time_point>> first_step_;  // step seen first, and when
  Clock::time_point last_bar_{};
  std::string bar_;  // what the terminal's last line shows
};

}  // namespace hyscale::trainer
