// The job's stages laid end to end: which stage a global step belongs to and its learning rate
// (linear warm-up from 0, then cosine decay to min_lr, restarting at every stage).
#pragma once

#include <cstdint>
#include <vector>

#include "hyscale/v1/job.pb.h"

namespace hyscale::trainer {

class StagePlan {
 public:
  explicit StagePlan(const v1::JobSpec& spec);

  struct Position {
    int stage = 0;              // index into spec.stages
    int64_t step_in_stage = 0;  // 0-based
  };
  // Global steps are 1-based: step 1 is the first optimizer step.
  Position locate(int64_t step) const;
  double learning_rate(int64_t step) const;
  int64_t total_steps() const { return total_steps_; }
  // The global step on which `stage` ends.
  int64_t last_step_of(int stage) const { return ends_[stage]; }
  const v1::StageSpec& stage(int index) const { return stages_[index]; }

 private:
  std::vector<v1::StageSpec> stages_;
  std::vector<int64_t> ends_;
  int64_t total_steps_ = 0;
};

}  // namespace hyscale::trainer
