#include "worker/trainer/schedule.h"

#include <algorithm>
#include <cmath>

namespace hyscale::trainer {

StagePlan::StagePlan(const v1::JobSpec& spec)
    : stages_(spec.stages().begin(), spec.stages().end()) {
  for (const auto& stage : stages_) {
    total_steps_ += stage.steps();
    ends_.push_back(total_steps_);
  }
}

StagePlan::Position StagePlan::locate(int64_t step) const {
  const auto it = std::lower_bound(ends_.begin(), ends_.end(), step);
  Position p;
  p.stage = static_cast<int>(std::min<std::ptrdiff_t>(it - ends_.begin(), ends_.size() - 1));
  const int64_t start = p.stage == 0 ? 0 : ends_[p.stage - 1];
  p.step_in_stage = step - 1 - start;
  return p;
}

double StagePlan::learning_rate(int64_t step) const {
  const Position p = locate(step);
  const auto& s = stages_[p.stage];
  const double done = static_cast<double>(p.step_in_stage) + 1.0;
  if (done <= s.warmup_steps()) return s.lr() * done / s.warmup_steps();
  const double decay_steps = std::max<int64_t>(1, s.steps() - s.warmup_steps());
  const double progress = std::min(1.0, (done - s.warmup_steps()) / decay_steps);
  return s.min_lr() + 0.5 * (s.lr() - s.min_lr()) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace hyscale::trainer
