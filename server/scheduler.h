// Gang scheduling of whole jobs onto worker devices. Pure logic: no I/O, no clocks, no locks.
//
// Policy (kept simple on purpose, so nobody has to guess why a job waits):
//  - Jobs are considered in strict priority order (higher first), FIFO within a priority.
//  - A job is placed whole (every rank on its own device slot) or not at all; a partial placement
//    is never held, so two jobs that each need every device cannot deadlock.
//  - When the head job of a priority does not fit, later jobs of the SAME priority may start if
//    they fit (skip-ahead); jobs of LOWER priority wait, so they can never delay the head.
//  - A job that could not fit even with every online device free does not block anyone: it waits
//    (workers may join) with a reason saying why.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hyscale/v1/service.pb.h"

namespace hyscale::server {

// One device of a worker, as the scheduler sees it. Worker devices with count N expand to N slots.
struct Slot {
  int flat_index = 0;  // position among all of the worker's slots
  v1::DeviceKind kind = v1::DEVICE_KIND_UNSPECIFIED;
  int kind_index = 0;  // position among the worker's slots of the same kind (RankPlacement's index)
  std::string name;
  int64_t memory_bytes = 0;
};

// A worker's slots, in the order its devices were registered.
std::vector<Slot> SlotsOf(const google::protobuf::RepeatedPtrField<v1::Device>& devices);

struct WorkerView {
  std::string id;
  std::vector<Slot> slots;
  std::set<int> busy;  // flat indexes in use (placed ranks, ranks still stopping)
};

struct JobRequest {
  std::string job_id;
  int priority = 0;
  int64_t order = 0;  // submission order (FIFO within a priority)
  v1::Resources resources;
};

struct Decision {
  std::string job_id;
  std::vector<v1::RankPlacement> placement;  // empty: not placed now
  std::string reason;                        // why not, when not placed
};

// Ranks of a request (0 means 1).
int RanksOf(const v1::Resources& resources);

// Where `resources` would go on `workers` as they are now, or nullopt. Ranks go to the workers
// with the most free matching slots first (fewer hosts per job), rank 0 on the first of them.
std::optional<std::vector<v1::RankPlacement>> Place(const v1::Resources& resources,
                                                    const std::vector<WorkerView>& workers);

// Why `resources` does not fit: either never on these workers, or not while others run.
std::string WhyNotPlaced(const v1::Resources& resources, const std::vector<WorkerView>& workers);

// Decides, for the waiting `queue` (any order), which jobs start now and where, under the policy
// above. Returns one Decision per request, in consideration order. `blocked_below`, if not null,
// receives the priority below which the pass held jobs back (nullopt: none).
std::vector<Decision> Schedule(std::vector<JobRequest> queue, std::vector<WorkerView> workers,
                               std::optional<int>* blocked_below = nullptr);

// Decides `request`, submitted after a pass over every other waiting job, exactly as a new pass
// would, in O(workers) instead of O(waiting jobs). Valid only while no capacity was freed since
// that pass (no worker joined, no slot or job ended, no restart came due, no waiting job left):
// then every job ahead of `request` in the pass order (higher priority, or equal and earlier)
// still cannot fit, because slots only got busier, so a pass would leave them waiting and give
// `request` the same slots. Only a job of strictly higher priority holding back lower ones stops
// it (same-priority skip-ahead is the policy). `workers`: as they are now, with the jobs placed
// since the pass; `blocked_below`: the pass's, updated when `request` becomes the job holding back.
Decision ScheduleNew(const JobRequest& request, const std::vector<WorkerView>& workers,
                     std::optional<int>* blocked_below);

}  // namespace hyscale::server
