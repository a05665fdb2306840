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

namespace hyscale::trainer {
namespace {

constexpr int kPhaseCount = static_cast<int>(Phase::kCount);
constexpr int kPassCount = 3;
constexpr int kSlotCount = kPhaseCount * kPassCount;

// Data, the optimizer and `other` are timed once a step; the others once per pass.
bool timed_per_pass(Phase phase) {
  return phase != Phase::kData && phase != Phase::kOptimizer && phase != Phase::kOther;
}

int slot_of(Phase phase, Pass pass) {
  const int p = static_cast<int>(phase);
  return timed_per_pass(phase) ? p * kPassCount + static_cast<int>(pass) : p * kPassCount;
}

const char* base_name(Phase phase) {
  static constexpr std::array<const char*, kPhaseCount> kNames = {
      "data",         "lm_head", "attn_proj", "selection", "attention",
      "indexer_loss", "mlp",     "comm",      "optimizer", "other"};
  return kNames[static_cast<size_t>(phase)];
}

// The clock that autograd's node callback reports to (BackwardAttribution keeps it).
std::atomic<PhaseClock*> attributed_clock{nullptr};

std::unique_ptr<at::ObserverContext> on_node_start(const at::RecordFunction& fn) {
  if (PhaseClock* clock = attributed_clock.load()) {
    clock->node_started(fn.forwardThreadId(), fn.seqNr());
  }
  return nullptr;
}

}  // namespace

std::string phase_name(Phase phase, Pass pass) {
  if (!timed_per_pass(phase)) return base_name(phase);
  static constexpr std::array<const char*, kPassCount> kSuffixes = {"_fwd", "_recompute", "_bwd"};
  return std::string(base_name(phase)) + kSuffixes[static_cast<size_t>(pass)];
}

const std::vector<std::string>& phase_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (Pass pass : {Pass::kForward, Pass::kRecompute, Pass::kBackward}) {
      for (int p = 0; p < kPhaseCount; ++p) {
        const auto phase = static_cast<Phase>(p);
        if (timed_per_pass(phase) || pass == Pass::kForward) out.push_back(phase_name(phase, pass));
      }
    }
    return out;
  }();
  return names;
}

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
    : timeline_(make_timeline(device)), slot_(slot_of(Phase::kOther, Pass::kForward)) {}

PhaseClock::~PhaseClock() = default;

void PhaseClock::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  forget_step();
  pass_ = Pass::kForward;
  phase_ = Phase::kOther;
  slot_ = slot_of(Phase::kOther, Pass::kForward);
  timeline_->stamp();
  slots_.push_back(slot_);
  started_ = true;
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
  // A slot is (phase, pass); the phases timed once a step only ever fill their forward slot.
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (per_slot[slot] <= 0) continue;
    out[phase_name(static_cast<Phase>(slot / kPassCount), static_cast<Pass>(slot % kPassCount))] =
        per_slot[slot];
  }
  forget_step();
  return out;
}

void PhaseClock::forget_step() {
  timeline_->clear();
  slots_.clear();
  created_by_.clear();
  started_ = false;
}

void PhaseClock::enter(int slot, Phase phase) {
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
  timeline_->stamp();
  slots_.push_back(slot);
}

void PhaseClock::node_started(uint64_t forward_thread, int64_t sequence_number) {
  // Nodes outside the forward's order (gradient accumulation into leaves) keep the current phase.
  if (sequence_number < 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Phase phase = Phase::kOther;
  const auto it = created_by_.find(forward_thread);
  if (it != created_by_.end()) {
    const auto& starts = it->second;
    const auto after = std::upper_bound(
        starts.begin(), starts.end(), static_cast<uint64_t>(sequence_number),
        [](uint64_t seq, const std::pair<uint64_t, Phase>& start) { return seq < start.first; });
    if (after != starts.begin()) phase = std::prev(after)->second;
  }
  switch_to(slot_of(phase, Pass::kBackward));
}

PhaseClock::Scope::Scope(PhaseClock& clock, Phase phase) : clock_(clock) {
  std::lock_guard<std::mutex> lock(clock_.mutex_);
  previous_slot_ = clock_.slot_;
  previous_phase_ = clock_.phase_;
  clock_.enter(slot_of(phase, clock_.pass_), phase);
}

PhaseClock::Scope::~Scope() {
  std::lock_guard<std::mutex> lock(clock_.mutex_);
  clock_.enter(previous_slot_, previous_phase_);
}

PhaseClock::PassGuard::PassGuard(PhaseClock& clock, Pass pass) : clock_(clock) {
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
