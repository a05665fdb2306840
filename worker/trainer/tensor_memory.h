// What the CPU's tensors hold, counted (hyscale-train --count-tensor-memory): a wrapper of
// libtorch's CPU allocator that keeps the live bytes of every block it hands out, their peak,
// and at the peak the live bytes by the tag each block was allocated under (the trainer's tag is
// the step phase running, PhaseClock::ActiveSlot). The CPU trainer runs the GPU's autograd graph,
// so this is the evidence for the planner's memory model (planner/cost_model.cc): which tensors
// are alive at the step's peak, and from which phase. Opt-in: it costs a lock per allocation.
#pragma once

#include <array>
#include <cstdint>

namespace hyscale::trainer::tensor_memory {

// Tags are in [0, kTags); any other value counts as kUntagged.
inline constexpr int kTags = 64;
inline constexpr int kUntagged = kTags;

struct Counts {
  int64_t live_bytes = 0;  // now
  int64_t peak_bytes = 0;  // the most at once since Install or the last ResetPeak
  // At that peak, the live bytes by the tag they were allocated under ([kUntagged]: outside any).
  std::array<int64_t, kTags + 1> peak_by_tag{};
  int peak_tag = kUntagged;  // the tag current when the peak was reached
};

// Makes the counting allocator libtorch's CPU allocator, over the one installed now; `tag` is
// asked at each allocation (null: every block untagged). Blocks allocated before are not
// counted. Once a process: later calls only replace `tag`.
void Install(int (*tag)());
bool Installed();

Counts Read();
// Starts a new peak from what is live now (at a step's start, say).
void ResetPeak();

}  // namespace hyscale::trainer::tensor_memory
