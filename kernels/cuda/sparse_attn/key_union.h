// Query grouping: the key lists of the blocks, built once a call into the workspace. G = 1: each
// query's slots up to its last valid one; G > 1: the sorted key union of each group of G queries
// with a G-bit mask per entry (common.cuh's KeyList reads both).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_util.cuh"
#include "kernels/shapes.h"

namespace hyscale::cuda::attn {

struct UnionPlan {
  int32_t* keys = nullptr;
  uint16_t* mask = nullptr;
  int32_t* count = nullptr;
  int64_t cap = 0;
};

inline int64_t groups_of(const SparseAttnShape& s, int64_t group) {
  return ceil_div(s.num_queries, group);
}

inline size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

// The workspace bytes of the plan.
size_t plan_bytes(const SparseAttnShape& s, int64_t group);
// Carves the plan out of `workspace`; returns the bytes used.
size_t build_plan(const SparseAttnShape& s, const int32_t* indices, int64_t group, void* workspace,
                  UnionPlan& plan, cudaStream_t stream);

}  // namespace hyscale::cuda::attn
