// The counting CPU allocator (worker/trainer/tensor_memory.h): live and peak bytes of tensors of
// known sizes, the peak's breakdown by the tag of each block's allocation, and the trainer's tag,
// the phase its clock is timing.
#include "worker/trainer/tensor_memory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/model/phases.h"

namespace hyscale::trainer {
namespace {

int current_tag = tensor_memory::kUntagged;
int Tag() {
  return current_tag;
}

// Floats of `bytes` bytes, allocated under `tag`.
torch::Tensor Block(int64_t bytes, int tag) {
  current_tag = tag;
  auto t = torch::empty({bytes / 4}, torch::kFloat);
  current_tag = tensor_memory::kUntagged;
  return t;
}

TEST(TrainerTensorMemory, CountsLiveAndPeakBytesByTag) {
  tensor_memory::Install(&Tag);
  ASSERT_TRUE(tensor_memory::Installed());
  const int64_t before = tensor_memory::Read().live_bytes;
  tensor_memory::ResetPeak();
  {
    auto a = Block(4000, 3);
    auto b = Block(8000, 5);
    EXPECT_EQ(tensor_memory::Read().live_bytes, before + 12000);
    a.reset();  // freed: the next block raises the peak by less than its size
    auto c = Block(20000, 3);
    auto view = c.narrow(0, 0, 10);  // a view allocates nothing
    const tensor_memory::Counts counts = tensor_memory::Read();
    EXPECT_EQ(counts.live_bytes, before + 28000);
    EXPECT_EQ(counts.peak_bytes, before + 28000);
    EXPECT_EQ(counts.peak_by_tag[3], 20000);
    EXPECT_EQ(counts.peak_by_tag[5], 8000);
    EXPECT_EQ(counts.peak_tag, 3);
    // Out-of-range tags count as untagged.
    auto d = Block(400, -7);
    EXPECT_EQ(tensor_memory::Read().peak_by_tag[tensor_memory::kUntagged] -
                  counts.peak_by_tag[tensor_memory::kUntagged],
              400);
  }
  // Everything freed; the peak stays until reset, then starts from what is live.
  tensor_memory::Counts after = tensor_memory::Read();
  EXPECT_EQ(after.live_bytes, before);
  EXPECT_EQ(after.peak_bytes, before + 28400);
  tensor_memory::ResetPeak();
  after = tensor_memory::Read();
  EXPECT_EQ(after.peak_bytes, before);
  EXPECT_EQ(after.peak_by_tag[3], 0);
  // A tensor's data stays aligned as libtorch's own (64 bytes).
  const auto odd = Block(12, 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(odd.data_ptr()) % 64, 0u);
}

TEST(TrainerTensorMemory, TagsByThePhaseTheTrainersClockTimes) {
  tensor_memory::Install(&PhaseClock::ActiveSlot);
  auto clock = c10::make_intrusive<PhaseClock>();
  EXPECT_EQ(PhaseClock::ActiveSlot(), -1);
  EXPECT_EQ(PhaseClock::SlotName(-1), "untimed");
  const int64_t before = tensor_memory::Read().live_bytes;
  tensor_memory::ResetPeak();
  clock->start();
  torch::Tensor attention, recomputed, mlp;
  {
    PhaseClock::Scope scope(*clock, v1::STEP_PHASE_ATTENTION);
    attention = torch::empty({1000}, torch::kFloat);
  }
  {
    PhaseClock::PassGuard pass(*clock, v1::STEP_PASS_RECOMPUTE);
    PhaseClock::Scope scope(*clock, v1::STEP_PHASE_MLP);
    recomputed = torch::empty({2000}, torch::kFloat);
  }
  clock->take();
  EXPECT_EQ(PhaseClock::ActiveSlot(), -1);
  mlp = torch::empty({500}, torch::kFloat);  // between steps: untimed
  const tensor_memory::Counts counts = tensor_memory::Read();
  EXPECT_EQ(counts.live_bytes, before + 14000);
  std::map<std::string, int64_t> by_name;
  for (int tag = 0; tag <= tensor_memory::kUntagged; ++tag) {
    if (counts.peak_by_tag[tag] == 0) continue;
    by_name[PhaseClock::SlotName(tag == tensor_memory::kUntagged ? -1 : tag)] +=
        counts.peak_by_tag[tag];
  }
  EXPECT_EQ(by_name["attention_fwd"], 4000);
  EXPECT_EQ(by_name["mlp_recompute"], 8000);
  EXPECT_EQ(PhaseClock::SlotName(counts.peak_tag), "untimed");
}

}  // namespace
}  // namespace hyscale::trainer
