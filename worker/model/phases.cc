#include "worker/model/phases.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#ifdef HYSCALE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "proto/events.h"

namespace hyscale::trainer {
namespace {

constexpr int kPassCount = v1::StepPass_MAX;  // forward, recompute, backward
constexpr int kSlotCount = v1::StepPhase_MAX * kPassCount;

// Slot (phase - 1) * kPassCount + (pass - 1); the phases timed once a step only ever fill their
// first.
int slot_of(v1::StepPhase phase, v1::StepPass pass) {
  const int first = (phase - 1) * kPassCount;
  return TimedPerPass(phase) ? first + (pass - 1) : first;
}

// Each slot's PhaseName, made once: the first lookup of the proto enums' names is slow, and
// take() runs inside the timed step.
const std::array<std::string, kSlotCount>& slot_names() {
  static const auto* names = [] {
    auto* out = new std::array<std::string, kSlotCount>;
    for (int slot = 0; slot < kSlotCount; ++slot) {
      (*out)[slot] = PhaseName(static_cast<v1::StepPhase>(slot / kPassCount + 1),
                               static_cast<v1::StepPass>(slot % kPassCount + 1));
    }
    return out;
  }();
  return *names;
}

// The clock that autograd's node callback reports to (BackwardAttribution keeps it).
std::atomic<PhaseClock*> attributed_clock{nullptr};

// The slot a started clock times now (PhaseClock::ActiveSlot); -1 between steps.
std::atomic<int> active_slot{-1};

std::unique_ptr<at::ObserverContext> on_node_start(const at::RecordFunction& fn) {
  if (PhaseClock* clock = attributed_clock.load()) {
    clock->node_started(fn.forwardThreadId(), fn.seqNr());
  }
  return nullptr;
}

}  // namespace

// Stamps taken at phase switches, and the seconds between consecutive ones.
class PhaseClock::Timeline {
 public:
  virtual ~Timeline() = default;
  virtual void stamp() = 0;
  // Seconds from each stamp to the next; waits for the device's last stamp.
  virtual std::vector<double> intervals() = 0;
  virtual void clear() = 0;
};

namespace {

class HostTimeline : public PhaseClock::Timeline {
 public:
  void stamp() override { stamps_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> intervals() override {
    std::vector<double> out;
    for (size_t i = 1; i < stamps_.size(); ++i) {
      out.push_back(std::chrono::duration<double>(stamps_[i] - stamps_[i - 1]).count());
    }
    return out;
  }
  void clear() override { stamps_.clear(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> stamps_;
};

#ifdef HYSCALE_HAVE_CUDA
// Events on the current stream of the recording thread (autograd's device thread in backward sets
// it to the forward's stream), so an interval is the stream's time between two switches: the
// kernels issued in between plus any wait for the host to issue them.
class CudaTimeline : public PhaseClock::Timeline {
 public:
  explicit CudaTimeline(c10::DeviceIndex device) : device_(device) {}
  void stamp() override {
    if (used_ == events_.size()) {
      events_.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    }
    events_[used_++]->record(at::cuda::getCurrentCUDAStream(device_));
  }
  std::vector<double> intervals() override {
    std::vector<double> out;
    if (used_ == 0) return out;
    events_[used_ - 1]->synchronize();
    for (size_t i = 1; i < used_; ++i) {
      out.push_back(static_cast<double>(events_[i - 1]->elapsed_time(*events_[i])) / 1e3);
    }
    return out;
  }
  void clear() override { used_ = 0; }  // the events are recorded again next step

 private:
  c10::DeviceIndex device_;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events_;
  size_t used_ = 0;
};
#endif

std::unique_ptr<PhaseClock::Timeline> make_timeline(torch::Device device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) {
    return std::make_unique<CudaTimeline>(device.has_index() ? device.index()
                                                             : c10::DeviceIndex{0});
  }
#endif
  (void)device;
  return std::make_unique<HostTimeline>();
}

}  // namespace

PhaseClock::PhaseClock(torch::Device device)
    : timeline_(make_timeline(device)), slot_(slot_of(v1::STEP_PHASE_OTHER, v1::STEP_PASS_FWD)) {
  slot_names();  // made before any step is timed
}

PhaseClock::~PhaseClock() = default;

void PhaseClock::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  forget_step();
  pass_ = v1::STEP_PASS_FWD;
  phase_ = v1::STEP_PHASE_OTHER;
  slot_ = slot_of(v1::STEP_PHASE_OTHER, v1::STEP_PASS_FWD);
  timeline_->stamp();
  slots_.push_back(slot_);
  started_ = true;
  active_slot.store(slot_);
}

std::map<std::string, double> PhaseClock::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, double> out;
  if (!started_) return out;
  timeline_->stamp();
  const std::vector<double> seconds = timeline_->intervals();
  std::array<double, kSlotCount> per_slot{};
  for (size_t i = 0; i < seconds.size() && i < slots_.size(); ++i)
    per_slot[slots_[i]] += seconds[i];
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (per_slot[slot] <= 0) continue;
    out[slot_names()[slot]] = per_slot[slot];
  }
  forget_step();
  return out;
}

void PhaseClock::forget_step() {
  if (started_) active_slot.store(-1);
  timeline_->clear();
  slots_.clear();
  created_by_.clear();
  started_ = false;
}

void PhaseClock::enter(int slot, v1::StepPhase phase) {
  if (started_ && torch::GradMode::is_enabled()) {
    // Autograd nodes created from here on (sequence numbers from peek() on, in this thread) belong
    // to `phase`.
    auto& starts = created_by_[at::RecordFunction::currentThreadId()];
    if (starts.empty() || starts.back().second != phase) {
      starts.emplace_back(at::sequence_number::peek(), phase);
    }
  }
  phase_ = phase;
  switch_to(slot);
}

void PhaseClock::switch_to(int slot) {
  if (slot == slot_) return;
  slot_ = slot;
  if (!started_) return;
  active_slot.store(slot);
  timeline_->stamp();
  slots_.push_back(slot);
}

void PhaseClock::node_started(uint64_t forward_thread, int64_t sequence_number) {
  // Nodes outside the forward's order (gradient accumulation into leaves) keep the current phase.
  if (sequence_number < 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  v1::StepPhase phase = v1::STEP_PHASE_OTHER;
  const auto it = created_by_.find(forward_thread);
  if (it != created_by_.end()) {
    const auto& starts = it->second;
    const auto after =
        std::upper_bound(starts.begin(), starts.end(), static_cast<uint64_t>(sequence_number),
                         [](uint64_t seq, const std::pair<uint64_t, v1::StepPhase>& start) {
                           return seq < start.first;
                         });
    if (after != starts.begin()) phase = std::prev(after)->second;
  }
  switch_to(slot_of(phase, v1::STEP_PASS_BWD));
}

int PhaseClock::ActiveSlot() {
  return active_slot.load(std::memory_order_relaxed);
}

const std::string& PhaseClock::SlotName(int slot) {
  static const std::string untimed = "untimed";
  return slot >= 0 && slot < kSlotCount ? slot_names()[slot] : untimed;
}

PhaseClock::Scope::Scope(PhaseClock& clock, v1::StepPhase phase) : clock_(clock) {
  std::lock_guard<std::mutex> lock(clock_.mutex_);
  previous_slot_ = clock_.slot_;
  previous_phase_ = clock_.phase_;
  clock_.enter(slot_of(phase, clock_.pass_), phase);
}

PhaseClock::Scope::~Scope() {
  std::lock_guard<std::mutex> lock(clock_.mutex_);
  clock_.enter(previous_slot_, previous_phase_);
}

PhaseClock::PassGuard::PassGuard(PhaseClock& clock, v1::StepPass pass) : clock_(clock) {
  std::lock_guard<std::mutex> lock(clock_.mutex_);
  previous_ = clock_.pass_;
  clock_.pass_ = pass;
}

PhaseClock::PassGuard::~PassGuard() {
  std::lock_guard<std::mutex> lock(clock_.mutex_);
  clock_.pass_ = previous_;
}

PhaseClock::BackwardAttribution::BackwardAttribution(PhaseClock& clock) {
  PhaseClock* none = nullptr;
  TORCH_CHECK(attributed_clock.compare_exchange_strong(none, &clock),
              "PhaseClock::BackwardAttribution: another one is alive in this process");
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_node_start).scopes({at::RecordScope::BACKWARD_FUNCTION}));
}

PhaseClock::BackwardAttribution::~BackwardAttribution() {
  at::removeCallback(handle_);
  attributed_clock.store(nullptr);
}

}  // namespace hyscale::trainer
