// Context parallelism's sequence layouts (hyscale.v1.CpLayout), named and ruled once: the job
// spec's validation, the planner's candidates and the trainer's shards all use these.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string_view>

#include "hyscale/v1/job.pb.h"

namespace hyscale {

inline constexpr v1::CpLayout kCpLayouts[] = {v1::CP_LAYOUT_CONTIGUOUS, v1::CP_LAYOUT_ZIGZAG,
                                              v1::CP_LAYOUT_ROUND_ROBIN};

// "contiguous", "zigzag" or "round-robin" (ParallelismSpec.cp_layout); INVALID_ARGUMENT
// "must be contiguous, zigzag or round-robin (got 'NAME')" otherwise.
absl::StatusOr<v1::CpLayout> ParseCpLayout(std::string_view name);
const char* CpLayoutName(v1::CpLayout layout);

// The equal parts a sequence splits into over `ranks`: zigzag gives each rank two chunks (2P),
// the others one (P).
int64_t CpShards(v1::CpLayout layout, int ranks);

}  // namespace hyscale
