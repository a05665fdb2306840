// Step-phase timing: where a training step's seconds go (DESIGN.md section 6 asks for a breakdown
// per phase), measured where the work runs. On a GPU every phase switch records a CUDA event on
// the current stream and the events are resolved once, at the end of the step; on the CPU the
// switches read the host clock. The intervals between switches are attributed to the phase that
// was active, so the phases add up to the step's span, with `other` for what no phase claims.
//
// The forward and the recomputation are timed by scopes around the layer's parts. The backward is
// run by autograd, not our code: while a BackwardAttribution is alive, each autograd node that
// starts switches to the backward of the phase whose forward scope created it (recorded by the
// autograd sequence numbers a scope spanned).
#pragma once

#include <ATen/record_function.h>
#include <torch/custom_class.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hyscale/v1/events.pb.h"

namespace hyscale::trainer {

// The phases and passes are hyscale.v1.StepPhase and StepPass (proto/hyscale/v1/events.proto),
// named on the wire by PhaseName (proto/events.h).

class PhaseClock : public torch::CustomClassHolder {
 public:
  // CUDA devices are timed with events on the current stream, anything else with the host clock.
  explicit PhaseClock(torch::Device device = torch::kCPU);
  ~PhaseClock() override;
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  // Attributes the work issued in its lifetime to `phase` in the clock's current pass. Nested
  // scopes take over until they end.
  class Scope {
   public:
    Scope(PhaseClock& clock, v1::StepPhase phase);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseClock& clock_;
    int previous_slot_;
    v1::StepPhase previous_phase_;
  };

  // Sets the pass for its lifetime (recomputation inside the backward, say).
  class PassGuard {
   public:
    PassGuard(PhaseClock& clock, v1::StepPass pass);
    ~PassGuard();
    PassGuard(const PassGuard&) = delete;
    PassGuard& operator=(const PassGuard&) = delete;

   private:
    PhaseClock& clock_;
    v1::StepPass previous_;
  };

  // While alive, autograd nodes are timed as the backward of the phase that created them. One at
  // a time in a process (autograd's callbacks are process-wide).
  class BackwardAttribution {
   public:
    explicit BackwardAttribution(PhaseClock& clock);
    ~BackwardAttribution();
    BackwardAttribution(const BackwardAttribution&) = delete;
    BackwardAttribution& operator=(const BackwardAttribution&) = delete;

   private:
    at::CallbackHandle handle_;
  };

  v1::StepPass pass() const { return pass_; }
  bool recomputing() const { return pass_ == v1::STEP_PASS_RECOMPUTE; }

  // Starts a step: forgets what was timed and stamps the step's start.
  void start();
  // Ends the step: stamps its end, waits for the device once, and returns the seconds of every
  // phase that took any, by PhaseName. The clock then waits for the next start().
  std::map<std::string, double> take();

  // Called by BackwardAttribution for each autograd node that starts (thread that created it,
  // its sequence number).
  void node_started(uint64_t forward_thread, int64_t sequence_number);

  // The slot (a phase in a pass) that the started clock is timing now, for tagging what the step
  // allocates (worker/trainer/tensor_memory.h); -1 outside a step. One process-wide value: the
  // clock started last sets it.
  static int ActiveSlot();
  // The slot's PhaseName ("attention_bwd", "optimizer"), "untimed" for -1.
  static const std::string& SlotName(int slot);

  class Timeline;  // host clock or CUDA events (phases.cc)

 private:
  void forget_step();                         // drops the stamps, slots and creators of a step
  void enter(int slot, v1::StepPhase phase);  // switches the slot and records where `phase` began
  void switch_to(int slot);                   // under mutex_

  std::mutex mutex_;
  std::unique_ptr<Timeline> timeline_;
  bool started_ = false;
  std::vector<int> slots_;  // the slot timed from each stamp to the next
  v1::StepPass pass_ = v1::STEP_PASS_FWD;
  int slot_;
  v1::StepPhase phase_ = v1::STEP_PHASE_OTHER;
  // Per creating thread, the autograd sequence numbers at which a forward phase began, increasing.
  std::map<uint64_t, std::vector<std::pair<uint64_t, v1::StepPhase>>> created_by_;
};

}  // namespace hyscale::trainer
