// The planner's cost model: per-GPU memory and step time of one way of running a job (a
// Candidate) on a device profile. Plain arithmetic, so a whole candidate table costs microseconds.
//
// Per layer and sequence, with N tokens over P context-parallel ranks (n = N/P local queries):
//   dense      projections + SwiGLU: 2 x (weights touched per token) x n FLOPs, x3 with backward
//   indexer    the sparse stage's indexer loss: its target (attention mass at the k selected
//   loss       keys, 2 H d_qk k n FLOPs) forward, the index scores' backward (4 H_I d_I k n)
//   selection  FlashTopK (or the score table + topk) over each local query's causal window:
//              2 H_I d_I sum(t+1) FLOPs, the sum taken on the busiest rank of the layout, so a
//              contiguous split pays ~2x (the last rank holds the longest windows)
//   attention  sparse fwd/bwd, FLOPs 2 H k (d_qk + d_v) n issued x G/dedup(G) (a group computes
//              over the union of its keys) or memory-bound on keys loaded, n k (d_qk+d_v) / dedup
//   recompute  replay: the forward again minus selection, plus index scores at the k saved
//              entries; re-selection: the whole forward again. In query chunks of C, the key
//              side's projections run once more and every kernel is called once more a chunk
//   comm       all-gather of the key side (N (d_qk + d_v + d_I) elements), hidden behind the
//              query projections (and, with a separate indexer group, the K/V half behind
//              FlashTopK); the backward reduce-scatter is exposed in full (as the trainer
//              measures it); the weight-gradient all-reduce hides behind backward compute.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hyscale/v1/job.pb.h"
#include "planner/profile.h"

namespace hyscale::server::planner {

using CpLayout = v1::CpLayout;  // proto/cp_layout.h names them
enum class IndexerGroup { kShared, kSeparate };
enum class Recompute { kNone, kReplay, kReselect };
// Whose kernels: HyScale's, or the Megatron-style stack (score table + topk selection, gather
// attention, re-selection when recomputing) that the scale simulation compares against, or the
// same stack with Megatron-naive selection (fp32 einsum table over whole row chunks + topk,
// DESIGN.md section 4 baseline a: every local query scores every key, masked ones included), as
// the layer benchmarks run it.
enum class Stack { kHyScale, kMegatron, kMegatronNaive };

const char* Name(IndexerGroup group);
const char* Name(Recompute recompute);  // "none", "replay", "reselect"
const char* Name(Stack stack);          // "hyscale", "megatron", "megatron-naive"

struct Candidate {
  int cp = 1;
  CpLayout layout = v1::CP_LAYOUT_CONTIGUOUS;
  IndexerGroup indexer = IndexerGroup::kShared;
  int group = 1;  // G
  Recompute recompute = Recompute::kNone;
  Stack stack = Stack::kHyScale;
  // Queries a recomputed layer runs at once (RecomputeSpec.query_chunk); 0: all local ones.
  int64_t query_chunk = 0;

  std::string Describe() const;  // "cp 32 zigzag shared G=2 replay", then " chunks of 8192"
};

// The shape of the work, read from a JobSpec.
struct Workload {
  int64_t seq_len = 1;
  int64_t batch = 1;
  int64_t layers = 1;
  int64_t d_model = 1, heads = 1, head_dim_qk = 1, head_dim_v = 1, d_ff = 1;
  int64_t indexer_heads = 1, indexer_dim = 1, topk = 1;
  int64_t vocab = 1;
  int64_t parameters = 0;
  int64_t indexer_parameters = 0;  // of `parameters`
  bool sparse = false;  // some stage attends sparsely: plan for it (the costly stage at length)
  bool fp8_selection = false;  // model.indexer.fp8_scores
  bool latent_kv = false;      // model.latent_kv: the values are the keys' first features
  // Every stage trains only the indexer (INDEXER_ONLY): the main model is frozen and nothing is
  // kept for a backward (worker/model/model.h ForwardOptions::frozen_main).
  bool indexer_only = false;

  static Workload Of(const v1::JobSpec& spec);
  // Stage `stage` of `spec` alone: its attention, what it trains and its batch shape.
  static Workload OfStage(const v1::JobSpec& spec, int stage);
};

struct MemoryBreakdown {
  // fp32 weights and AdamW's moments with the gradients; with HyScale's recomputation those that
  // exist at the peak and one layer's bf16 weight copies (autocast).
  double weights = 0;
  // With recomputation the fp32 inputs of the layers the backward has not reached and one query
  // chunk's tensors while its layer's backward runs (HyScale: the gradients of the layer's output
  // and, chunked, input too); without it every layer's saved tensors.
  double activations = 0;
  double indices = 0;   // saved top-k indices
  double gathered = 0;  // the (all-gathered) key side and its gradients
  // Selection scratch; without HyScale's recomputation also a layer's backward (of a chunk), the
  // gradients of a chunked layer's input and output, logits.
  double workspace = 0;
  // The sum; plus 10 % allocator slack where the model is not fitted to measured peaks (all but
  // HyScale's recomputed step and its frozen warm-up).
  double total = 0;
};

struct Prediction {
  Candidate candidate;
  int data_parallel = 1;                  // replicas of the CP group
  int64_t sequences = 1;                  // per replica per step
  double imbalance = 1;                   // busiest rank's causal work / the mean
  std::map<std::string, double> seconds;  // per step: dense, selection, indexer_loss,
                                          // attention, recompute, launches, optimizer,
                                          // exposed_comm
  // One layer of one sequence, the terms the step is made of, for comparison with a layer
  // benchmark: dense_fwd, selection (FlashTopK or table + topk), score_gather (index scores at
  // the k kept entries, which the Megatron-style stack forms twice for its indexer loss; HyScale
  // forms them inside the loss's backward), indexer_loss_fwd
  // (its target), indexer_loss_bwd (the index scores' backward), attention_fwd,
  // attention_bwd, recompute (its compute, dense included), launches, gather (the key side's
  // all-gather, all of it), gather_exposed, recompute_gather_exposed, reduce_scatter (exposed).
  std::map<std::string, double> layer;
  double compute_s = 0;
  double comm_s = 0;          // all communication, hidden or not
  double exposed_comm_s = 0;  // what the step waits for
  double step_s = 0;
  // PredictJob: the job's seconds of steps, each stage's steps at its own step time (evaluations
  // not counted); what the planner ranks candidates by.
  double job_s = 0;
  MemoryBreakdown memory;
  std::string rejected;  // why the plan cannot run; empty when it can
};

// `gpus`: devices of the job; the CP group is replicated gpus / cp times (data parallel).
Prediction Predict(const Workload& work, const Candidate& candidate, const DeviceProfile& profile,
                   int gpus);

// The smallest query chunk the planner and the trainer choose: below it a chunk's kernel calls
// cost more than its memory saves. A dense stage's chunks may be smaller: each of their rows
// scores every key.
inline constexpr int64_t kMinQueryChunk = 1024;
inline constexpr int64_t kMinDenseQueryChunk = 16;
// What a frozen dense model's query chunk may hold of key lists, rows that span the sequence:
// beyond a few rows a chunk is no faster (chunks of 2048 rows at 128K, as measured).
inline constexpr double kFrozenKeyListBytes = 2.0 * (1 << 30);

// HyScale with a query_chunk of 0 and recomputation (or a frozen main model): the prediction at
// the largest chunk that fits the profile's memory, 0 (all local queries) when they fit, else
// powers of two from the local sequence down to kMinQueryChunk (the smallest when none fits).
// Dense work goes down to kMinDenseQueryChunk. A frozen dense model (the warm-up) starts where a
// chunk's key lists fit kFrozenKeyListBytes and takes such chunks even where all its queries fit:
// only the chunk changes its memory, not its speed.
// Otherwise Predict as given.
Prediction PredictFitted(const Workload& work, const Candidate& candidate,
                         const DeviceProfile& profile, int gpus);

// The job `spec` as a candidate runs it: PredictFitted of its workload (Workload::Of: the costly
// stage at length), and where it has several stages, of each stage's own workload too (the trainer
// fits each stage's query chunk to the device on its own): rejected where a stage does not fit
// (naming it), at the largest memory of them, and its job_s summed over them. `stages` (if given)
// gets each stage's prediction, in the spec's order.
Prediction PredictJob(const v1::JobSpec& spec, const Candidate& candidate,
                      const DeviceProfile& profile, int gpus,
                      std::vector<Prediction>* stages = nullptr);

}  // namespace hyscale::server::planner
