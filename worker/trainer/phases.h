// Step-phase timing: where a training step's seconds go (DESIGN.md section 6 asks for a
// breakdown per phase). Forward phases are timed with scopes; backward phases with identity
// markers whose backward opens and closes a region, since autograd runs them, not our code.
#pragma once

#include <torch/custom_class.h>
#include <torch/types.h>

#include <array>
#include <chrono>
#include <cstddef>

namespace hyscale::trainer {

enum class Phase : std::size_t {
  kData,
  kSelection,
  kAttentionFwd,
  kAttentionBwd,
  kIndexerLoss,
  kRecompute,
  kMlp,
  kOptimizer,
  kComm,
  kCount,
};
constexpr std::size_t kPhaseCount = static_cast<std::size_t>(Phase::kCount);
const char* phase_name(Phase phase);

using PhaseSeconds = std::array<double, kPhaseCount>;

class PhaseClock : public torch::CustomClassHolder {
 public:
  using Clock = std::chrono::steady_clock;

  // Times one forward phase; inside recomputation the whole recompute is one phase instead.
  class Scope {
   public:
    Scope(PhaseClock& clock, Phase phase) : clock_(clock), phase_(phase), start_(Clock::now()) {}
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseClock& clock_;
    Phase phase_;
    Clock::time_point start_;
  };

  void add(Phase phase, double seconds) { seconds_[static_cast<std::size_t>(phase)] += seconds; }
  void set_recomputing(bool recomputing) { recomputing_ = recomputing; }
  bool recomputing() const { return recomputing_; }

  // A backward region runs from its first open to its last close.
  void open_backward(Phase phase);
  void close_backward(Phase phase);

  // Returns the seconds gathered since the last call and starts over.
  PhaseSeconds take();

 private:
  PhaseSeconds seconds_{};
  std::array<Clock::time_point, kPhaseCount> open_since_{};
  std::array<bool, kPhaseCount> open_{};
  bool recomputing_ = false;
};

// Identity on x. In backward: mark_region_output opens `phase`, mark_region_input closes it.
// Place the first on a region's output and the second on its input.
torch::Tensor mark_region_output(const torch::Tensor& x,
                                 const c10::intrusive_ptr<PhaseClock>& clock, Phase phase);
torch::Tensor mark_region_input(const torch::Tensor& x, const c10::intrusive_ptr<PhaseClock>& clock,
                                Phase phase);

}  // namespace hyscale::trainer
