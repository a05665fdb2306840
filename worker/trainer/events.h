// What hyscale-train reports: one JSON object per line per event (the worker agent's protocol,
// and a record in files) and, for a person at a terminal, a progress bar with ETA redrawn in place
// plus a readable line per event.
//
// Every JSON event has "event" and "time" (Unix seconds). Events and their other fields:
//   job_started      name, total_steps, device (where this process trains: "cpu", or "cuda:0"
//                    and the GPU's name and PCI bus id, which tell the ranks' GPUs apart),
//                    query_group (the sparse attention kernels' G; 0: their own choice)
//   stage_started    stage, name, step, steps, attention, trains
//   step             step, total_steps, stage, loss, lm_loss, indexer_loss, lr, step_seconds,
//                    tokens_per_second, peak_memory_bytes, eta_seconds,
//                    phase_seconds {data, selection_fwd, attention_bwd, ..., other} (the
//                    names of worker/model/phases.h; on a GPU timed on the device, and
//                    adding up to the step), under context parallelism
//                    comm_exposed_seconds and comm_overlapped_seconds,
//                    and after an evaluation accuracy, indexer_recall
//   stage_finished   stage, name, step
//   checkpoint_written / checkpoint_loaded   step, path
//   rendezvous       address ("host:port" of the store rank 0 serves), world_size; written by
//                    rank 0 of a context-parallel job before the other ranks are waited for
//   warning          message
//   job_finished     ok, elapsed_seconds, and when not ok reason
#pragma once

#include <absl/status/status.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "hyscale/v1/job.pb.h"

namespace hyscale::trainer {

struct EvalMetrics {
  double accuracy = 0;        // argmax accuracy at the positions with a target
  double indexer_recall = 0;  // indexer top-k vs the top-k of dense attention mass
};

// Context-parallel communication of one step: exposed (waited for) and overlapped (hidden
// behind computation) seconds.
struct CommMetrics {
  double exposed_seconds = 0;
  double overlapped_seconds = 0;
};

struct StepMetrics {
  int64_t step = 0;  // 1-based, counted over all stages
  int stage = 0;
  double loss = 0;
  double lm_loss = 0;
  double indexer_loss = 0;
  double lr = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  int64_t peak_memory_bytes = 0;
  std::map<std::string, double> phase_seconds;  // by phase name
  std::optional<CommMetrics> comm;              // under context parallelism
  std::optional<EvalMetrics> eval;
};

class EventSink {
 public:
  // JSON lines go to each of `json_streams`; when `terminal` is non-null, the progress bar and
  // readable lines go there.
  EventSink(std::vector<std::ostream*> json_streams, std::ostream* terminal);

  // hyscale-train's outputs: JSON lines to `file` (if non-null) and to stdout -- unless stdout is a
  // terminal, in which case stderr gets the progress bar and readable lines instead.
  explicit EventSink(std::ostream* file);

  void JobStarted(const v1::JobSpec& spec, const std::string& device);
  void StageStarted(int index, const v1::StageSpec& stage, int64_t step);
  // Call every step: the bar follows every step, a step event is written on the first step seen,
  // every spec.log_every steps, after an evaluation and on the last step.
  void Step(const StepMetrics& metrics, int64_t total_steps);
  void StageFinished(int index, const v1::StageSpec& stage, int64_t step);
  void CheckpointWritten(int64_t step, const std::string& path);
  void CheckpointLoaded(int64_t step, const std::string& path);
  void Rendezvous(const std::string& address, int world_size);
  void Warning(const std::string& message);
  void JobFinished(const absl::Status& status);

 private:
  using Clock = std::chrono::steady_clock;

  // Writes one JSON line and, on the terminal, `readable` (if not empty) above the bar.
  void Emit(const std::string& json_line, const std::string& readable);
  void DrawBar(const StepMetrics& m, int64_t total_steps, double eta_seconds);

  const std::vector<std::ostream*> json_streams_;
  std::ostream* const terminal_;
  int log_every_ = 10;
  const Clock::time_point started_ = Clock::now();
  std::optional<std::pair<int64_t, Clock::time_point>> first_step_;  // step seen first, and when
  Clock::time_point last_bar_{};
  std::string bar_;  // what the terminal's last line shows
};

}  // namespace hyscale::trainer
