// The planner: how a job would run (context parallelism, layout, indexer group, query grouping,
// recomputation) and what it costs per GPU. Plain C++ over the JobSpec message (no gRPC), shared
// by the coordinator's PlanJob and SubmitJob (`parallelism: {mode: AUTO}`) and `hyscale plan`.
// It enumerates candidates, predicts each with the cost model (cost_model.h) on a device profile
// (profile.h), rejects those over device memory and picks the fastest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyscale/v1/job.pb.h"
#include "planner/cost_model.h"
#include "planner/profile.h"

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
// The lightning indexers' parameters (every layer's): what an INDEXER_ONLY stage trains.
int64_t IndexerParameterCount(const v1::ModelSpec& model);

// Memory of one rank training `spec` (defaults applied by the caller or not: zeros read as the
// smallest meaningful values). Formula, with B = batch, T = seq_len, d = d_model, L = layers,
// H = heads, k = attended keys per query (T for dense stages, min(T, topk) when every stage is
// sparse):
//   weights + gradients + AdamW = 16 bytes x parameters
//   activations per layer = 4 B x B x T x (6 d + 3 d_ff + H (dqk + dv) + ih idim + 2 H k)
//     (norm inputs and outputs, q/k/v, indexer queries, SwiGLU gate/up/hidden, attention
//      probabilities and scores over the attended keys)
//   with recompute.enabled only each layer's input (4 B x B x T x d) is kept per layer, plus one
//   layer's full activations during its recomputation (of B x query_chunk tokens when chunked)
//   plus logits and their gradient: 2 x 4 B x B x T x vocab
//   plus 10% for allocator slack and workspaces.
MemoryEstimate EstimateMemory(const v1::JobSpec& spec);

// Context-parallel shards shorter than this cost more in collective steps than they save.
inline constexpr int64_t kMinShardTokens = 1024;

struct PlanOptions {
  int gpus = 1;
  DeviceProfile profile;
  Stack stack = Stack::kHyScale;
  // What may be chosen; empty: everything the stack supports.
  std::vector<Recompute> recompute;
  std::vector<IndexerGroup> indexer_groups;
};

// The candidates of a job: CP degree P over the divisors of `gpus` up to what the sequence needs
// (seq_len / kMinShardTokens, at least 1), and for P > 1 each layout and indexer group; G over
// kQueryGroups when a stage is sparse (else 1); recomputation none, replay (sparse only) or
// re-selection. The Megatron-style stack has G = 1, a shared group and no replay.
std::vector<Candidate> EnumerateCandidates(const Workload& work, const PlanOptions& options);

struct PlanResult {
  // The feasible first, fastest over the job (Prediction::job_s; the step where the spec gives
  // no steps), then the rejected.
  std::vector<Prediction> candidates;
  int winner = -1;                 // index into candidates; -1 when none fits
  std::vector<std::string> why;    // why the winner won, one line per choice it made
  std::vector<std::string> notes;  // the profile and how the numbers were made
  // A job of several stages: the winner on each stage's own workload (PredictJob), and the
  // stages' steps at their step times, seconds.
  std::vector<Prediction> stages;
  double job_seconds = 0;
};

PlanResult PlanJob(const v1::JobSpec& spec, const PlanOptions& options);

// The candidate a job's own parallelism settings name (MANUAL, or AUTO once planned; none set
// means one rank per sequence), with its recomputation policy: what its metrics are predicted
// from.
Candidate CandidateOf(const v1::JobSpec& spec);

}  // namespace hyscale::server::planner
