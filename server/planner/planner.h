// The planner: how a job would run (ranks, context parallelism, kernel grouping) and what it
// needs per rank. Plain C++ over the JobSpec message (no gRPC), shared by the coordinator's
// PlanJob and, later, `hyscale plan`.
//
// For now every plan is single-device: 1 rank, context_parallel 1, cp_layout "none",
// query_group 1. Step time is not estimated yet (no measured profiles are loaded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyscale/v1/job.pb.h"

namespace hyscale::server::planner {

struct MemoryEstimate {
  int64_t parameters = 0;        // count
  int64_t parameter_bytes = 0;   // fp32 weights
  int64_t gradient_bytes = 0;    // fp32 gradients
  int64_t optimizer_bytes = 0;   // AdamW first and second moments, fp32
  int64_t activation_bytes = 0;  // peak saved activations of one step
  int64_t total_bytes = 0;
};

// The parameter count of the DSA model of `spec.model` (the trainer's layout: embedding,
// per layer attention + lightning indexer + SwiGLU + two RMSNorms, final norm, untied lm_head).
int64_t ParameterCount(const v1::ModelSpec& model);

// Memory of one rank training `spec` (defaults applied by the caller or not: zeros read as the
// smallest meaningful values). Formula, with B = batch, T = seq_len, d = d_model, L = layers,
// H = heads, k = attended keys per query (T for dense stages, min(T, topk) when every stage is
// sparse):
//   weights + gradients + AdamW = 16 bytes x parameters
//   activations per layer = 4 B x B x T x (6 d + 3 d_ff + H (dqk + dv) + ih idim + 2 H k)
//     (norm inputs and outputs, q/k/v, indexer queries, SwiGLU gate/up/hidden, attention
//      probabilities and scores over the attended keys)
//   with recompute.enabled only each layer's input (4 B x B x T x d) is kept per layer, plus one
//   layer's full activations during its recomputation
//   plus logits and their gradient: 2 x 4 B x B x T x vocab
//   plus 10% for allocator slack and workspaces.
MemoryEstimate EstimateMemory(const v1::JobSpec& spec);

struct PlanShape {
  int ranks = 1;
  int context_parallel = 1;
  std::string cp_layout = "none";
  int query_group = 1;
  MemoryEstimate memory;
  std::vector<std::string> notes;  // how the numbers were made
};

PlanShape PlanSingleDevice(const v1::JobSpec& spec);

}  // namespace hyscale::server::planner
