#include "server/scheduler.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace hyscale::server {
namespace {

bool Matches(const Slot& slot, const v1::Resources& resources) {
  if (resources.device_kind() != v1::DEVICE_KIND_UNSPECIFIED &&
      slot.kind != resources.device_kind()) {
    return false;
  }
  return slot.memory_bytes >= resources.memory_bytes_per_rank();
}

std::string Describe(const v1::Resources& resources) {
  std::string kind =
      resources.device_kind() == v1::DEVICE_KIND_UNSPECIFIED
          ? "device"
          : absl::StrCat(v1::DeviceKind_Name(resources.device_kind()).substr(12), " device");
  std::string text = absl::StrCat(RanksOf(resources), " ", kind, "(s)");
  if (resources.memory_bytes_per_rank() > 0) {
    absl::StrAppend(&text, " with >= ", resources.memory_bytes_per_rank(), " bytes each");
  }
  return text;
}

struct SlotCount {
  int matching = 0;  // slots that match, busy or not
  int free = 0;      // of those, not busy
};

SlotCount CountMatching(const v1::Resources& resources, const std::vector<WorkerView>& workers) {
  SlotCount count;
  for (const auto& worker : workers) {
    for (const Slot& slot : worker.slots) {
      if (!Matches(slot, resources)) continue;
      ++count.matching;
      if (worker.busy.count(slot.flat_index) == 0) ++count.free;
    }
  }
  return count;
}

// (worker index, flat slot index) per rank, or empty when the job does not fit.
std::vector<std::pair<size_t, int>> Fit(const v1::Resources& resources,
                                        const std::vector<WorkerView>& workers) {
  const int ranks = RanksOf(resources);
  // Count first: most jobs that wait do not fit, and counting allocates nothing.
  if (CountMatching(resources, workers).free < ranks) return {};
  std::vector<std::pair<size_t, std::vector<int>>> free;  // worker index, matching free slots
  for (size_t w = 0; w < workers.size(); ++w) {
    std::vector<int> slots;
    for (const Slot& slot : workers[w].slots) {
      if (Matches(slot, resources) && workers[w].busy.count(slot.flat_index) == 0) {
        slots.push_back(slot.flat_index);
      }
    }
    if (!slots.empty()) free.emplace_back(w, std::move(slots));
  }
  // Most free slots first, then by worker id, so placements are deterministic and compact.
  std::stable_sort(free.begin(), free.end(), [&](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return workers[a.first].id < workers[b.first].id;
  });
  std::vector<std::pair<size_t, int>> out;
  for (const auto& [w, slots] : free) {
    for (int flat : slots) {
      if (static_cast<int>(out.size()) == ranks) return out;
      out.emplace_back(w, flat);
    }
  }
  return out;
}

std::vector<v1::RankPlacement> ToPlacement(const std::vector<std::pair<size_t, int>>& fit,
                                           const std::vector<WorkerView>& workers) {
  std::vector<v1::RankPlacement> placement;
  for (size_t rank = 0; rank < fit.size(); ++rank) {
    const WorkerView& worker = workers[fit[rank].first];
    const Slot& slot = worker.slots[fit[rank].second];
    v1::RankPlacement p;
    p.set_rank(static_cast<int>(rank));
    p.set_worker_id(worker.id);
    p.set_device_index(slot.kind_index);
    p.set_device_name(slot.name);
    placement.push_back(std::move(p));
  }
  return placement;
}

// Whether `resources` would fit with every device of `workers` free.
bool FitsWhenIdle(const v1::Resources& resources, const std::vector<WorkerView>& workers) {
  return CountMatching(resources, workers).matching >= RanksOf(resources);
}

// One job's turn in a pass (the policy in scheduler.h). `taken`: the slots it takes, if placed.
Decision Decide(const JobRequest& request, const std::vector<WorkerView>& workers,
                std::optional<int>& blocked_below, std::vector<std::pair<size_t, int>>& taken) {
  Decision decision;
  decision.job_id = request.job_id;
  taken.clear();
  if (blocked_below && request.priority < *blocked_below) {
    decision.reason = absl::StrCat("waiting behind a job of higher priority ", *blocked_below);
    return decision;
  }
  taken = Fit(request.resources, workers);
  if (taken.empty()) {
    decision.reason = WhyNotPlaced(request.resources, workers);
    // Only a job that would fit on idle devices holds back lower priorities; one that can never
    // fit on the current workers would block the cluster forever.
    if (!blocked_below && FitsWhenIdle(request.resources, workers)) {
      blocked_below = request.priority;
    }
    return decision;
  }
  decision.placement = ToPlacement(taken, workers);
  return decision;
}

}  // namespace

int RanksOf(const v1::Resources& resources) {
  return resources.ranks() <= 0 ? 1 : resources.ranks();
}

std::vector<Slot> SlotsOf(const google::protobuf::RepeatedPtrField<v1::Device>& devices) {
  std::vector<Slot> slots;
  std::map<v1::DeviceKind, int> per_kind;
  for (const auto& device : devices) {
    for (int i = 0; i < device.count(); ++i) {
      Slot slot;
      slot.flat_index = static_cast<int>(slots.size());
      slot.kind = device.kind();
      slot.kind_index = per_kind[device.kind()]++;
      slot.name = device.name();
      slot.memory_bytes = device.memory_bytes();
      slots.push_back(std::move(slot));
    }
  }
  return slots;
}

std::optional<std::vector<v1::RankPlacement>> Place(const v1::Resources& resources,
                                                    const std::vector<WorkerView>& workers) {
  auto fit = Fit(resources, workers);
  if (fit.empty()) return std::nullopt;
  return ToPlacement(fit, workers);
}

std::string WhyNotPlaced(const v1::Resources& resources, const std::vector<WorkerView>& workers) {
  const auto [matching, free] = CountMatching(resources, workers);
  if (matching < RanksOf(resources)) {
    return absl::StrCat("needs ", Describe(resources), "; online workers have ", matching,
                        " matching in all: waiting for workers to join");
  }
  return absl::StrCat("needs ", Describe(resources), "; ", free, " of ", matching,
                      " matching are free: waiting for running jobs");
}

std::vector<Decision> Schedule(std::vector<JobRequest> queue, std::vector<WorkerView> workers,
                               std::optional<int>* blocked_below) {
  std::stable_sort(queue.begin(), queue.end(), [](const JobRequest& a, const JobRequest& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.order < b.order;
  });
  std::vector<Decision> decisions;
  decisions.reserve(queue.size());
  std::optional<int> blocked;  // a waiting job of this priority holds back lower ones
  std::vector<std::pair<size_t, int>> taken;
  // Jobs of a shape that did not fit, with their reason, while no slot was taken since: the same
  // shape cannot fit either, so a long queue of few shapes costs O(shapes x workers), not
  // O(jobs x workers).
  std::map<std::tuple<int, v1::DeviceKind, int64_t>, std::pair<std::string, bool>> unplaced;
  for (const JobRequest& request : queue) {
    const auto shape = std::make_tuple(RanksOf(request.resources), request.resources.device_kind(),
                                       request.resources.memory_bytes_per_rank());
    const bool held_back = blocked && request.priority < *blocked;
    const auto known = unplaced.find(shape);
    if (!held_back && known != unplaced.end()) {
      Decision decision;
      decision.job_id = request.job_id;
      decision.reason = known->second.first;
      if (!blocked && known->second.second) blocked = request.priority;
      decisions.push_back(std::move(decision));
      continue;
    }
    decisions.push_back(Decide(request, workers, blocked, taken));
    for (const auto& [w, flat] : taken) workers[w].busy.insert(flat);
    if (!taken.empty()) {
      unplaced.clear();
    } else if (!held_back) {
      unplaced[shape] = {decisions.back().reason, FitsWhenIdle(request.resources, workers)};
    }
  }
  if (blocked_below != nullptr) *blocked_below = blocked;
  return decisions;
}

Decision ScheduleNew(const JobRequest& request, const std::vector<WorkerView>& workers,
                     std::optional<int>* blocked_below) {
  // At its turn in a pass, only a job ahead of it (priority >= its own) can be holding back.
  std::optional<int> at_turn;
  if (*blocked_below && **blocked_below >= request.priority) at_turn = *blocked_below;
  std::vector<std::pair<size_t, int>> taken;
  Decision decision = Decide(request, workers, at_turn, taken);
  // Either unchanged, or `request` now holds back, from a priority above the old one.
  if (at_turn) *blocked_below = at_turn;
  return decision;
}

}  // namespace hyscale::server
