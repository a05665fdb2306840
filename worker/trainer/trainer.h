// The training loop of hyscale-train: stages, AdamW with warm-up + cosine, gradient clipping,
// evaluation, checkpoints and resume, events with a per-phase breakdown.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "hyscale/v1/job.pb.h"
#include "worker/model/model.h"

namespace hyscale::parallel {
class ContextParallelGroup;
}

namespace hyscale::trainer {

class EventSink;

struct TrainerOptions {
  bool resume = false;                     // continue from the newest valid checkpoint
  std::optional<AttentionMode> attention;  // overrides every stage's attention mode
  std::optional<bool> recompute;           // overrides spec.recompute.enabled
  std::optional<bool> selection_replay;    // overrides spec.recompute.selection_replay
  bool evaluate = true;                    // evaluate at stage ends and every eval_every steps
  // false: no stage forms the indexer's loss (its target, KL and index-score backward), so the
  // indexer learns nothing; the loss's share of a step is the difference (bench/train_bench.py).
  bool indexer_loss = true;
  torch::Device device = torch::kCPU;  // where the model and its batches live
  // The job's attempt under the service (HYSCALE_ATTEMPT): fences its checkpoint folder against
  // trainers of earlier attempts. -1: none.
  int64_t attempt = -1;
  // This rank's context-parallel group (spec.parallelism); null: one process per sequence.
  std::shared_ptr<parallel::ContextParallelGroup> context_parallel;
  // Count the CPU tensors' bytes by phase (tensor_memory.h) and report each step's peak.
  bool count_tensor_memory = false;
};

class Trainer {
 public:
  // `spec` must be validated (ValidateJobSpec) with defaults applied.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const v1::JobSpec& spec,
                                                         const TrainerOptions& options,
                                                         EventSink& events);
  ~Trainer();

  // Trains from the current step to the end of the last stage.
  absl::Status Run();

 private:
  class Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyscale::trainer
