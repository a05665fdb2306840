#include "worker/trainer/phases.h"

#include <torch/csrc/autograd/custom_function.h>

namespace hyscale::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double seconds_since(PhaseClock::Clock::time_point start) {
  return std::chrono::duration<double>(PhaseClock::Clock::now() - start).count();
}

// Identity whose backward calls clock->open_backward or close_backward.
template <bool kOpens>
struct RegionMarker : torch::autograd::Function<RegionMarker<kOpens>> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const c10::intrusive_ptr<PhaseClock>& clock, Phase phase) {
    ctx->saved_data["clock"] = c10::IValue::make_capsule(clock);
    ctx->saved_data["phase"] = static_cast<int64_t>(phase);
    return {x.view_as(x)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto clock =
        c10::static_intrusive_pointer_cast<PhaseClock>(ctx->saved_data["clock"].toCapsule());
    const auto phase = static_cast<Phase>(ctx->saved_data["phase"].toInt());
    if (kOpens) {
      clock->open_backward(phase);
    } else {
      clock->close_backward(phase);
    }
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor mark(const torch::Tensor& x, const c10::intrusive_ptr<PhaseClock>& clock, Phase phase,
                   bool opens) {
  if (!clock || !x.requires_grad()) return x;
  return opens ? RegionMarker<true>::apply(x, clock, phase)[0]
               : RegionMarker<false>::apply(x, clock, phase)[0];
}

}  // namespace

const char* phase_name(Phase phase) {
  static constexpr std::array<const char*, kPhaseCount> kNames = {
      "data",      "selection", "attention_fwd", "attention_bwd", "indexer_loss",
      "recompute", "mlp",       "optimizer",     "comm"};
  return kNames[static_cast<std::size_t>(phase)];
}

PhaseClock::Scope::~Scope() {
  if (!clock_.recomputing()) clock_.add(phase_, seconds_since(start_));
}

void PhaseClock::open_backward(Phase phase) {
  const auto i = static_cast<std::size_t>(phase);
  if (open_[i]) return;
  open_[i] = true;
  open_since_[i] = Clock::now();
}

void PhaseClock::close_backward(Phase phase) {
  const auto i = static_cast<std::size_t>(phase);
  if (!open_[i]) return;
  seconds_[i] += seconds_since(open_since_[i]);
  open_[i] = false;
}

PhaseSeconds PhaseClock::take() {
  PhaseSeconds out = seconds_;
  seconds_ = {};
  open_ = {};
  return out;
}

torch::Tensor mark_region_output(const torch::Tensor& x,
                                 const c10::intrusive_ptr<PhaseClock>& clock, Phase phase) {
  return mark(x, clock, phase, /*opens=*/true);
}

torch::Tensor mark_region_input(const torch::Tensor& x, const c10::intrusive_ptr<PhaseClock>& clock,
                                Phase phase) {
  return mark(x, clock, phase, /*opens=*/false);
}

}  // namespace hyscale::trainer
