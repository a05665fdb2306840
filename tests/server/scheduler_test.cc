#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

namespace hyscale::server {
namespace {

WorkerView Worker(const std::string& id, int gpus, int64_t memory = 80'000'000'000,
                  v1::DeviceKind kind = v1::DEVICE_KIND_GPU) {
  google::protobuf::RepeatedPtrField<v1::Device> devices;
  auto* device = devices.Add();
  device->set_name(kind == v1::DEVICE_KIND_GPU ? "gpu" : "cpu");
  device->set_kind(kind);
  device->set_memory_bytes(memory);
  device->set_count(gpus);
  return {id, SlotsOf(devices), {}};
}

JobRequest Job(const std::string& id, int ranks, int priority = 0, int64_t order = 0,
               int64_t memory = 0, v1::DeviceKind kind = v1::DEVICE_KIND_GPU) {
  JobRequest request;
  request.job_id = id;
  request.priority = priority;
  request.order = order;
  request.resources.set_ranks(ranks);
  request.resources.set_device_kind(kind);
  request.resources.set_memory_bytes_per_rank(memory);
  return request;
}

const Decision& Find(const std::vector<Decision>& decisions, const std::string& id) {
  for (const auto& d : decisions) {
    if (d.job_id == id) return d;
  }
  static Decision none;
  ADD_FAILURE() << "no decision for " << id;
  return none;
}

TEST(SchedulerTest, SlotsCountPerKind) {
  google::protobuf::RepeatedPtrField<v1::Device> devices;
  auto* cpu = devices.Add();
  cpu->set_kind(v1::DEVICE_KIND_CPU);
  cpu->set_count(1);
  auto* gpu = devices.Add();
  gpu->set_kind(v1::DEVICE_KIND_GPU);
  gpu->set_count(2);
  const auto slots = SlotsOf(devices);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].kind_index, 0);
  EXPECT_EQ(slots[1].kind_index, 0);
  EXPECT_EQ(slots[2].kind_index, 1);
  EXPECT_EQ(slots[2].flat_index, 2);
}

TEST(SchedulerTest, HigherPriorityFirstThenFifo) {
  const auto decisions =
      Schedule({Job("low", 1, 0, 1), Job("high", 1, 5, 2), Job("low2", 1, 0, 3)}, {Worker("w", 2)});
  ASSERT_EQ(decisions.size(), 3u);
  EXPECT_EQ(decisions[0].job_id, "high");
  EXPECT_EQ(decisions[1].job_id, "low");
  EXPECT_EQ(decisions[2].job_id, "low2");
  EXPECT_FALSE(decisions[0].placement.empty());
  EXPECT_FALSE(decisions[1].placement.empty());
  EXPECT_TRUE(decisions[2].placement.empty());
  EXPECT_NE(decisions[2].reason.find("waiting for running jobs"), std::string::npos);
}

TEST(SchedulerTest, GangIsAllOrNothing) {
  WorkerView w = Worker("w", 4);
  w.busy = {0};
  const auto decisions = Schedule({Job("big", 4)}, {w});
  EXPECT_TRUE(decisions[0].placement.empty());  // 3 free slots are never half-used
}

TEST(SchedulerTest, GangSpansWorkersWithDistinctSlots) {
  const auto decisions = Schedule({Job("j", 3)}, {Worker("a", 2), Worker("b", 2)});
  const auto& p = decisions[0].placement;
  ASSERT_EQ(p.size(), 3u);
  std::set<std::pair<std::string, int>> used;
  for (size_t r = 0; r < p.size(); ++r) {
    EXPECT_EQ(p[r].rank(), static_cast<int>(r));
    used.insert({p[r].worker_id(), p[r].device_index()});
  }
  EXPECT_EQ(used.size(), 3u);
}

TEST(SchedulerTest, TwoJobsNeedingEveryDeviceDoNotDeadlock) {
  const std::vector<WorkerView> cluster = {Worker("a", 2), Worker("b", 2)};
  const auto decisions = Schedule({Job("first", 4, 0, 1), Job("second", 4, 0, 2)}, cluster);
  EXPECT_EQ(Find(decisions, "first").placement.size(), 4u);
  EXPECT_TRUE(Find(decisions, "second").placement.empty());
}

TEST(SchedulerTest, MemoryAndKindRespected) {
  const std::vector<WorkerView> cluster = {
      Worker("small", 2, 16'000'000'000), Worker("cpu", 4, 1'000'000'000'000, v1::DEVICE_KIND_CPU)};
  auto decisions = Schedule({Job("j", 1, 0, 1, 40'000'000'000)}, cluster);
  EXPECT_TRUE(decisions[0].placement.empty());
  EXPECT_NE(decisions[0].reason.find("waiting for workers to join"), std::string::npos);
  decisions = Schedule({Job("j", 1, 0, 1, 8'000'000'000)}, cluster);
  ASSERT_EQ(decisions[0].placement.size(), 1u);
  EXPECT_EQ(decisions[0].placement[0].worker_id(), "small");
  decisions = Schedule({Job("any", 4, 0, 1, 0, v1::DEVICE_KIND_UNSPECIFIED)}, cluster);
  EXPECT_EQ(decisions[0].placement.size(), 4u);
}

TEST(SchedulerTest, SkipAheadOnlyWithinPriority) {
  WorkerView w = Worker("w", 2);
  w.busy = {0};
  const auto decisions =
      Schedule({Job("head", 2, 5, 1), Job("same", 1, 5, 2), Job("lower", 1, 0, 3)}, {w});
  EXPECT_TRUE(Find(decisions, "head").placement.empty());
  EXPECT_EQ(Find(decisions, "same").placement.size(), 1u);  // same priority may skip ahead
  EXPECT_TRUE(Find(decisions, "lower").placement.empty());  // lower priority waits for head
  EXPECT_NE(Find(decisions, "lower").reason.find("higher priority"), std::string::npos);
}

TEST(SchedulerTest, NeverFittingJobDoesNotBlockOthers) {
  const auto decisions = Schedule({Job("huge", 16, 9, 1), Job("small", 1, 0, 2)}, {Worker("w", 2)});
  EXPECT_TRUE(Find(decisions, "huge").placement.empty());
  EXPECT_NE(Find(decisions, "huge").reason.find("waiting for workers to join"), std::string::npos);
  EXPECT_EQ(Find(decisions, "small").placement.size(), 1u);
}

TEST(SchedulerTest, SameShapeReasonsFollowPlacementsWithinAPass) {
  WorkerView w = Worker("w", 4);
  w.busy = {0};
  const auto decisions = Schedule(
      {Job("a", 4, 0, 1), Job("b", 4, 0, 2), Job("small", 1, 0, 3), Job("c", 4, 0, 4)}, {w});
  EXPECT_NE(Find(decisions, "a").reason.find("3 of 4 matching are free"), std::string::npos);
  EXPECT_EQ(Find(decisions, "b").reason, Find(decisions, "a").reason);
  EXPECT_EQ(Find(decisions, "small").placement.size(), 1u);
  EXPECT_NE(Find(decisions, "c").reason.find("2 of 4 matching are free"), std::string::npos)
      << Find(decisions, "c").reason;
}

TEST(SchedulerTest, NoWorkersAtAll) {
  const auto decisions = Schedule({Job("j", 1)}, {});
  EXPECT_TRUE(decisions[0].placement.empty());
  EXPECT_NE(decisions[0].reason.find("0 matching"), std::string::npos);
}

// Marks the slots of `placement` busy, as the coordinator does once a job is SCHEDULED.
void Occupy(const std::vector<v1::RankPlacement>& placement, std::vector<WorkerView>& workers) {
  for (const auto& p : placement) {
    for (auto& w : workers) {
      if (w.id != p.worker_id()) continue;
      for (const Slot& slot : w.slots) {
        if (slot.kind_index == p.device_index() && slot.kind == v1::DEVICE_KIND_GPU) {
          w.busy.insert(slot.flat_index);
        }
      }
    }
  }
}

// ScheduleNew after a pass must decide a new job exactly as a new pass over every waiting job
// would: same placement, same reason, same job holding back, and nobody else moves.
TEST(SchedulerTest, NewJobDecidedAloneAsAFullPassWould) {
  std::mt19937 random(7);
  auto pick = [&](int n) { return static_cast<int>(random() % static_cast<unsigned>(n)); };
  for (int round = 0; round < 500; ++round) {
    std::vector<WorkerView> workers;
    for (int w = 0, n = pick(4); w < n; ++w) {
      workers.push_back(Worker("w" + std::to_string(w), 1 + pick(4)));
      for (const Slot& slot : workers.back().slots) {
        if (pick(3) == 0) workers.back().busy.insert(slot.flat_index);
      }
    }
    std::vector<JobRequest> queue;
    for (int j = 0, n = pick(8); j < n; ++j) {
      queue.push_back(Job("j" + std::to_string(j), 1 + pick(6), pick(3), j));
    }
    // The pass that ran before the submission; its placements now hold their slots.
    std::optional<int> blocked;
    std::vector<JobRequest> waiting;
    for (const auto& d : Schedule(queue, workers, &blocked)) {
      if (!d.placement.empty()) {
        Occupy(d.placement, workers);
      } else {
        for (const auto& q : queue) {
          if (q.job_id == d.job_id) waiting.push_back(q);
        }
      }
    }
    const JobRequest fresh = Job("new", 1 + pick(6), pick(3), 100);
    std::optional<int> incremental = blocked;
    const Decision alone = ScheduleNew(fresh, workers, &incremental);

    std::vector<JobRequest> all = waiting;
    all.push_back(fresh);
    std::optional<int> full_blocked;
    const auto full = Schedule(all, workers, &full_blocked);
    SCOPED_TRACE("round " + std::to_string(round));
    const Decision& expected = Find(full, "new");
    EXPECT_EQ(alone.reason, expected.reason);
    ASSERT_EQ(alone.placement.size(), expected.placement.size());
    for (size_t r = 0; r < alone.placement.size(); ++r) {
      EXPECT_EQ(alone.placement[r].worker_id(), expected.placement[r].worker_id());
      EXPECT_EQ(alone.placement[r].device_index(), expected.placement[r].device_index());
    }
    EXPECT_EQ(incremental, full_blocked);
    for (const auto& d : full) {
      if (d.job_id != "new") {
        EXPECT_TRUE(d.placement.empty()) << d.job_id;
      }
    }
  }
}

TEST(SchedulerTest, NewJobWaitsBehindHigherPriorityButMaySkipAheadInItsOwn) {
  WorkerView w = Worker("w", 2);
  w.busy = {0};
  std::optional<int> blocked;
  Schedule({Job("head", 2, 5, 1)}, {w}, &blocked);
  ASSERT_EQ(blocked, 5);
  const Decision lower = ScheduleNew(Job("lower", 1, 0, 2), {w}, &blocked);
  EXPECT_TRUE(lower.placement.empty());
  EXPECT_EQ(lower.reason, "waiting behind a job of higher priority 5");
  const Decision same = ScheduleNew(Job("same", 1, 5, 3), {w}, &blocked);
  EXPECT_EQ(same.placement.size(), 1u);
  // A higher-priority job that must wait now holds back from its own priority.
  w.busy = {0, 1};
  const Decision higher = ScheduleNew(Job("higher", 2, 9, 4), {w}, &blocked);
  EXPECT_TRUE(higher.placement.empty());
  EXPECT_EQ(blocked, 9);
}

}  // namespace
}  // namespace hyscale::server
