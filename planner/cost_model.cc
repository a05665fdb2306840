#include "planner/cost_model.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>

#include "planner/flops.h"
#include "planner/planner.h"
#include "proto/cp_layout.h"

namespace hyscale::server::planner {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr double kTableChunkRows = 8192;   // Megatron-style: score table rows per block
constexpr double kGatherChunkRows = 1024;  // Megatron-style: queries gathered per block
// The share of a layer's backward transients alive at the peak of HyScale's step without
// recomputation (StoredStepMemory).
constexpr double kStoredBackwardAlive = 0.12;
// The frozen dense stage's loss on the GPU (dense_indexer_kl, kernels/torch/cuda.cc, given the
// attention's log-sum-exps as the trainer gives them) works in blocks of at most
// kDenseLossBlockRows rows, fewer where a row's N keys pass kDenseLossRowBudget (the op's
// kDenseTableBlockBytes / kDenseBytesPerPair, 2048 rows at 128K), each block's [rows, N] tables
// alive together: the target (fp32; the KL's gradient in its place), the scores (fp32) and their
// ReLU gates (a 64-bit word).
constexpr double kDenseLossBlockRows = 4096;
constexpr double kDenseLossRowBudget = double(int64_t(1) << 28);  // rows x keys of a block
constexpr double kDenseLossPairBytes = 4 + 4 + 8;
// A frozen dense chunk's loss tables, bytes: its rows in the op's blocks.
double DenseLossTableBytes(double seqs, double chunk, double N) {
  const double rows =
      std::min({chunk, kDenseLossBlockRows, std::max(1.0, kDenseLossRowBudget / N)});
  return seqs * rows * N * kDenseLossPairBytes;
}
// Bytes a frozen dense query row holds while its attention output runs: its key list (int32 over
// the sequence, -1 past its position) and the attention op's contiguous copy of it, for a batch of
// sequences (one sequence's list is taken as it is: 5 bytes a key with the bool mask that makes
// it, within this bound). The H200's warm-up at 128K (8.01 GiB, chunks of 2048) held these 2 GiB
// beyond the model state, the layer's input and output and the key side.
constexpr double kFrozenDenseRowKeyBytes = 2 * 4;

// Sum of (t + 1) over the positions the busiest rank holds: the causal work of one layer.
double BusiestCausalWork(CpLayout layout, double n_total, int p) {
  const double n = n_total / p;
  switch (layout) {
    case v1::CP_LAYOUT_CONTIGUOUS:  // the last rank: positions [(p-1)n, pn)
      return n * (p - 1) * n + n * (n + 1) / 2;
    case v1::CP_LAYOUT_ZIGZAG: {  // chunks r and 2p-1-r of c tokens: equal for every rank
      const double c = n / 2;
      return c * c * (2 * p - 1) + c * (c + 1);
    }
    case v1::CP_LAYOUT_ROUND_ROBIN:  // rank p-1: positions p-1, 2p-1, ...
      return n * p + p * n * (n - 1) / 2;
    default:  // no layout: one rank holds it all
      return n_total * (n_total + 1) / 2;
  }
}

// Runs of consecutive positions per rank: one kernel call each.
double Runs(CpLayout layout, double n_local) {
  switch (layout) {
    case v1::CP_LAYOUT_CONTIGUOUS:
      return 1;
    case v1::CP_LAYOUT_ZIGZAG:
      return 2;
    case v1::CP_LAYOUT_ROUND_ROBIN:
      return n_local;
    default:
      return 1;
  }
}

constexpr double kF32 = 4;  // fp32 bytes

// Bytes of memory traffic a head and (query, key) entry of HyScale's dense table path
// (worker/model DsaLayerImpl::dense_attention, the stage that trains every weight): the
// attention's forward (logits, mask, softmax, the casts, the products), its backward, and the
// indexer loss's recomputation and backward a head of the indexer. Fitted to the phases of the
// 2048x4 model on an H100 at 8K and 32K in chunks of 4096 and 1024 (attention_fwd 0.264 / 2.841
// s, attention_bwd 0.357 / 4.153, indexer_loss 0.235 / 2.585 over four layers), at the profile's
// 2780 GB/s: 57 / 56, 77 / 81, 51 / 51 (docs/performance.md section 13).
constexpr double kDenseTableForwardBytes = 56;
constexpr double kDenseTableBackwardBytes = 80;
constexpr double kDenseIndexerTableBytes = 51;

// The score tables HyScale's dense attention (the trainer's, worker/model) forms a query row, over
// every key of a sequence, in fp32: the attention's logits and probabilities (H each), the
// indexer's per-head scores and their ReLU (H_I each), and a few of one row each.
double DenseTableRowBytes(const Workload& w) {
  return static_cast<double>(w.seq_len) *
         (2.0 * static_cast<double>(w.heads + w.indexer_heads) + 4) * 4;
}

// What of them is alive a query row in a recomputed dense layer's attention backward, its peak:
// the probabilities the softmax saved and three H-tables the backward forms on its way back to
// the logits, and about five of one row each; the indexer's tables are gone by then. Counted on
// the CPU in fp32 (hyscale-train --count-tensor-memory at 1K and 2K, whole and in chunks of 256:
// docs/log/2026-12-07-dense-table-memory.md). Under the GPU's autocast (activations of `ab` < 4
// bytes) two bf16 H-tables more: the matmuls' casts (the H100's peaks at 8K and 32K in chunks of
// 4096 and 1024, 52.87 and 53.02 GiB: 20 bytes a head and key, docs/performance.md section 13).
double DenseBackwardRowBytes(const Workload& w, double ab) {
  const double per_head = 4 * kF32 + (ab < kF32 ? 2 * ab : 0);
  return static_cast<double>(w.seq_len) * (per_head * static_cast<double>(w.heads) + 5 * kF32);
}

// A ring all-gather (or reduce-scatter) of `bytes` in total over p ranks.
double RingSeconds(double bytes, int p, const DeviceProfile& prof) {
  if (p <= 1 || bytes <= 0) return 0;
  const double link = p <= prof.devices_per_node ? prof.intra_node_gbps : prof.inter_node_gbps;
  return bytes * (p - 1) / p / (link * kGiga * prof.collective_efficiency) +
         (p - 1) * prof.collective_latency_s;
}

// The sizes of one rank's step that the memory models read.
struct StepSizes {
  double seqs, layers;   // sequences a rank holds; layers
  double N, n;           // keys (the sequence) and this rank's query rows of a sequence
  double chunk, chunks;  // the rows a layer runs at once, and how many such chunks
  double d, H, dqk, dv, hi, di, k, key_elems;
  double ab;                  // bytes an activation (2 under the trainer's CUDA autocast)
  double row_bytes;           // a gathered key row (Megatron-style)
  double packed;              // bytes a kept top-k entry, as HyScale packs them
  double dense_table_row;     // a dense query row's score tables; frozen, its key lists
  double dense_backward_row;  // what of them a recomputed layer's backward holds (not frozen)
  bool megatron, frozen;
};

// hyscale-train's recomputed step (worker/model/model.cc recompute_backward): its peak is in a
// layer's attention backward. What is alive there is the list below, counted tensor by tensor on
// the CPU (hyscale-train --count-tensor-memory, docs/log/2026-12-05-planner-memory.md), in the
// dtypes the CUDA path gives them; or in the LM head's backward (below). Within 5 % of the H200's
// measured peaks (docs/performance.md section 13): the allocator's share is in them.
MemoryBreakdown RecomputedStepMemory(const Workload& w, const Candidate& c,
                                     const DeviceProfile& prof, const StepSizes& s) {
  const double seqs = s.seqs, layers = s.layers, N = s.N, n = s.n, chunk = s.chunk;
  const double d = s.d, H = s.H, dqk = s.dqk, dv = s.dv, hi = s.hi, di = s.di, k = s.k;
  const double key_elems = s.key_elems, idx_elems = s.di, ab = s.ab, packed = s.packed;
  const double dense_row = std::max(s.dense_table_row, s.dense_backward_row);
  constexpr double f = kF32;
  const bool autocast = ab < f;  // bf16 activations: the trainer's CUDA autocast
  MemoryBreakdown mem;
  const bool whole = s.chunks <= 1;
  const bool replay = c.recompute == Recompute::kReplay;
  const double tokens = seqs * n;    // this rank's query rows
  const double keys = seqs * N;      // the keys they see (all-gathered under CP)
  const double rows = seqs * chunk;  // the rows the layer in backward runs at once

  // One chunk row of the layer in backward, tensor by tensor.
  double row = 2 * d * f;  // attn_norm's normalized rows and output (fp32)
  // Under autocast, the bf16 casts of attn_norm's output for wq, the indexer's wq and ww (whole,
  // also for wk and the indexer's wk).
  if (autocast) row += (whole ? 5 : 3) * d * ab;
  row += H * dqk * ab;                        // the queries after RoPE
  row += (hi * di + hi) * ab;                 // the indexer's queries after RoPE, head weights
  row += H * dv * ab + H * f;                 // the attention output, its log-sum-exp (fp32)
  row += 2 * d * f;                           // the layer's output, the residual's gradient
  row += H * dv * ab + H * dqk * ab + H * f;  // the backward's dO, dq, row deltas (fp32)
  if (w.sparse) {
    row += k * 4;      // the replayed (or re-selected) indices, unpacked (int32)
    row += k * f;      // the index scores at them
    row += 2 * k * f;  // the indexer loss's target and the KL's gradient
    // Whole: the recomputed layer's re-packed indices (its LayerOutput's, until
    // recompute_backward returns).
    if (whole && replay) row += k * packed;
  } else {
    row += dense_row;  // a dense row's score tables over every key, at their peak
  }

  // The model state at layer l's backward (from L - 1 down to 0): fp32 weights and AdamW's two
  // moments, the gradients of the LM head and of layers l..L-1 (the embedding's comes last),
  // under autocast the layer's bf16 weight copies; and the fp32 inputs of layers 0..l, which
  // the backward has not reached. Linear in l: the worst layer is the first or the last.
  const double params = static_cast<double>(w.parameters);
  const double head_params = static_cast<double>(w.vocab + 1) * d;  // LM head, final norm
  const double layer_params =
      std::max(0.0, (params - static_cast<double>(w.vocab) * d - head_params) / layers);
  const double layer_input = tokens * d * f;  // the residual stream is fp32 under autocast
  const double token_ids = tokens * 3 * 8;    // the tokens, targets and positions (int64)
  const double l = layer_input > f * layer_params ? layers - 1 : 0;
  mem.weights = 12 * params + f * (head_params + (layers - l) * layer_params) +
                (autocast ? ab * layer_params : 0);
  mem.activations = (l + 1) * layer_input  // the inputs of layers 0..l
                    + layer_input          // the gradient of the layer's output (from above)
                    + rows * row + token_ids;
  if (!whole) mem.activations += layer_input;  // the layer input's gradient (x_grad), whole
  // Every layer's packed indices, kept by the recomputation's state; re-selection keeps none
  // (the layer's own are the chunk rows').
  mem.indices = w.sparse && replay ? layers * tokens * k * packed : 0;
  // The key side: the keys in the activations' dtype, the indexer's in fp32 (its LayerNorm's
  // output under autocast); the attention backward's key gradient, fp32 from the kernel and its
  // cast to the keys' dtype (kernels/torch/cuda.cc), for every key the chunk sees (all at the
  // last); chunked, the key side's fp32 gradient accumulators.
  mem.gathered = keys * (key_elems * ab + di * f) + keys * key_elems * (f + ab);
  if (!whole) mem.gathered += keys * (key_elems + di) * f;
  if (c.indexer == IndexerGroup::kSeparate) mem.gathered += N * idx_elems * ab;  // own buffer
  // Re-selection: FlashTopK's scratch in the recomputed forward (counted; replay has none).
  mem.workspace = w.sparse && !replay ? prof.topk_scratch_bytes + 2 * seqs * chunk * k * 4 : 0;

  // The other candidate peak, the LM head's backward before the layers' (the peak in query
  // chunks of N / 32, the 1M step's: docs/log/2026-12-05-planner-memory.md): the head's gradient
  // alone; every layer's input and the head's (fp32); the recomputed final RMSNorm's backward
  // at its pow, five fp32 rows of d (x's gradient through x * r, the gradient from the mean,
  // x^1, 2 x^1 and their product); the logits and their gradient.
  const double head_weights = 12 * params + f * head_params + (autocast ? ab * head_params : 0);
  const double head_activations = (layers + 1) * layer_input + 5 * layer_input + token_ids;
  const double logits_bytes = 2 * tokens * static_cast<double>(w.vocab) * ab;
  // (Every layer's indices are alive at both.)
  if (head_weights + head_activations + logits_bytes >
      mem.weights + mem.activations + mem.gathered + mem.workspace) {
    mem.weights = head_weights;
    mem.activations = head_activations;
    mem.gathered = 0;
    mem.workspace = logits_bytes;
  }
  return mem;
}

// The other steps (no recomputation, the Megatron-style stacks, the frozen warm-up): every layer's
// saved tensors, or a frozen layer's, with the backward's transients on top.
MemoryBreakdown StoredStepMemory(const Workload& w, const Candidate& c, const DeviceProfile& prof,
                                 const StepSizes& s) {
  const double seqs = s.seqs, layers = s.layers, N = s.N, n = s.n, chunk = s.chunk,
               chunks = s.chunks;
  const double d = s.d, H = s.H, dqk = s.dqk, dv = s.dv, hi = s.hi, di = s.di, k = s.k;
  const double key_elems = s.key_elems, idx_elems = s.di, ab = s.ab, packed = s.packed;
  const double row_bytes = s.row_bytes, dense_table_row = s.dense_table_row;
  const bool megatron = s.megatron, frozen = s.frozen, dense_hyscale = !w.sparse && !megatron;
  constexpr double f = kF32;
  MemoryBreakdown mem;
  // A frozen main model keeps its fp32 weights; only the indexers have gradients and moments.
  mem.weights = frozen ? f * static_cast<double>(w.parameters) +
                             12.0 * static_cast<double>(w.indexer_parameters)
                       : 16.0 * static_cast<double>(w.parameters);
  // One query row of a layer, saved for its backward and the backward's transients on top, bytes.
  double row_saved = 0, row_backward = 0;
  if (megatron) {
    row_saved = (6 * d + 3 * w.d_ff + H * (dqk + dv) + hi * di + H) * ab;
    if (w.sparse) row_saved += H * k * ab;  // gather attention saves probabilities
    row_backward = H * (dqk + dv) * ab;
  } else {
    // hyscale-train's layer under bf16 autocast (worker/model/model.cc) without recomputation,
    // tensor by tensor: the two RMSNorms' fp32 normalized rows and outputs and the residual
    // (5 d fp32) with the linears' bf16 casts of their inputs (6 d); the queries after RoPE
    // (RoPE's backward keeps nothing, so the projection's output goes: counted on the CPU,
    // docs/performance.md section 13); the indexer's likewise and its head weights; the
    // attention output and its log-sum-exp; SwiGLU's gate, activation, up and product; the
    // indexer loss's scores (k fp32: its target and the KL's gradient come in backward).
    row_saved = 5 * d * f + 6 * d * ab + H * dqk * ab + hi * di * ab + hi * ab + H * dv * ab +
                H * f + 4 * w.d_ff * ab + (w.sparse ? k * f : 0);
    // While the attention backward runs: the queries' gradient through RoPE (two bf16 copies)
    // and the kernel's fp32 one, and the output's gradient; the indexer loss's target and the
    // KL's gradient.
    row_backward = (2 * ab + f) * H * dqk + H * dv * ab + (w.sparse ? 2 * k * f : 0);
  }
  // The final norm and output projection keep the last layer's output (fp32), and unless
  // recomputed their normalized rows and bf16 cast.
  const double head = megatron ? 0 : (c.recompute == Recompute::kNone ? d * (2 * f + ab) : d * f);
  // The residual stream (each layer's input) is fp32 under autocast. A frozen main model keeps
  // nothing: one layer's input and output.
  if (frozen) {
    mem.activations = 2 * seqs * n * d * f;
  } else if (c.recompute == Recompute::kNone) {
    mem.activations = layers * seqs * n * (row_saved + dense_table_row / 2) + seqs * n * head;
  } else {
    mem.activations = (layers * d * f + head) * seqs * n + seqs * chunk * row_saved;
  }
  if (w.sparse) {
    // One layer's selection (int32), or every layer's kept for replay (HyScale's packed).
    const double one_layer = seqs * n * k * 4;
    mem.indices = c.recompute == Recompute::kReselect || frozen
                      ? one_layer
                      : layers * one_layer * (megatron ? 4 : packed) / 4;
  }
  // Two in flight + fp32 gradients; frozen, only the indexer keys' gradient.
  mem.gathered = frozen ? N * (key_elems + idx_elems) * ab + N * idx_elems * f
                        : N * (key_elems + idx_elems) * (2 * ab + f);
  if (c.indexer == IndexerGroup::kSeparate) mem.gathered += N * idx_elems * ab;  // own buffer
  double scratch = 0;
  if (w.sparse && megatron) {
    scratch = std::min(kTableChunkRows, n) * N * 4 + std::min(kGatherChunkRows, n) * k * row_bytes;
  } else if (w.sparse) {
    scratch = prof.topk_scratch_bytes + 2 * chunk * k * 4;
  }
  // A layer's backward transients (per chunk); a chunked layer's backward holds its input's and
  // output's gradients whole (fp32). HyScale's step without recomputation peaks with only
  // kStoredBackwardAlive of them on top of the saved rows (the backward frees a layer's saved
  // tensors as it makes its gradients): fitted to the H100's peaks of the 2048x4 step at 24K, 32K,
  // 40K and 48K (38.57, 47.98, 57.39, 66.80 GiB; PlannerTest.TheStepWithoutRecomputationAgainst-
  // TheH100s), which the whole set of transients overshot by 36 %.
  const double alive = w.sparse && !megatron ? kStoredBackwardAlive : 1;
  const double layer_backward = frozen ? 0 : alive * seqs * chunk * row_backward;
  const double chunked_grads = chunks > 1 && !frozen ? 2 * seqs * n * d * f : 0;
  // Logits and their gradient; a frozen step forms none.
  const double logits_bytes = frozen ? 0 : 2 * seqs * n * w.vocab * f;
  // A frozen chunk's key lists are gone when its loss runs; its queries (the attention's and the
  // indexer's with its head weights) and the attention's output are alive through both.
  const double tables =
      dense_hyscale && frozen
          ? std::max(seqs * chunk * dense_table_row, DenseLossTableBytes(seqs, chunk, N)) +
                seqs * chunk * (H * (dqk + dv) + hi * (di + 1)) * ab
          : seqs * chunk * dense_table_row;
  mem.workspace = scratch + tables + layer_backward + chunked_grads + logits_bytes;
  return mem;
}

}  // namespace

const char* Name(IndexerGroup group) {
  return group == IndexerGroup::kShared ? "shared" : "separate";
}

const char* Name(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kReplay:
      return "replay";
    case Recompute::kReselect:
      return "reselect";
  }
  return "?";
}

const char* Name(Stack stack) {
  switch (stack) {
    case Stack::kHyScale:
      return "hyscale";
    case Stack::kMegatron:
      return "megatron";
    case Stack::kMegatronNaive:
      return "megatron-naive";
  }
  return "?";
}

std::string Candidate::Describe() const {
  return absl::StrCat(stack == Stack::kHyScale ? "" : absl::StrCat(Name(stack), " "), "cp ", cp,
                      " ", CpLayoutName(layout), " ", Name(indexer), " G=", group, " ",
                      Name(recompute),
                      query_chunk > 0 ? absl::StrCat(" chunks of ", query_chunk) : "");
}

Workload Workload::Of(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  Workload w;
  w.seq_len = std::max(1, spec.data().seq_len());
  w.batch = std::max(1, spec.data().batch_size());
  w.layers = std::max(1, m.layers());
  w.d_model = std::max(1, m.d_model());
  w.heads = std::max(1, m.heads());
  w.head_dim_qk = std::max(1, m.head_dim_qk());
  w.head_dim_v = std::max(1, m.head_dim_v());
  w.d_ff = std::max(1, m.d_ff());
  w.indexer_heads = std::max(1, m.indexer().heads());
  w.indexer_dim = std::max(1, m.indexer().dim());
  w.topk = std::max(1, m.indexer().topk());
  w.vocab = std::max(1, m.vocab_size());
  w.parameters = ParameterCount(m);
  w.indexer_parameters = IndexerParameterCount(m);
  w.fp8_selection = m.indexer().fp8_scores();
  w.latent_kv = m.latent_kv();
  w.indexer_only = spec.stages_size() > 0;
  for (const auto& stage : spec.stages()) {
    w.sparse |= stage.attention() == v1::SPARSE;
    w.indexer_only &= stage.trains() == v1::INDEXER_ONLY;
  }
  return w;
}

Workload Workload::OfStage(const v1::JobSpec& spec, int stage) {
  const v1::StageSpec& own = spec.stages(stage);
  v1::JobSpec alone = spec;
  if (own.seq_len() > 0) alone.mutable_data()->set_seq_len(own.seq_len());
  if (own.batch_size() > 0) alone.mutable_data()->set_batch_size(own.batch_size());
  alone.clear_stages();
  *alone.add_stages() = own;
  return Of(alone);
}

Prediction Predict(const Workload& w, const Candidate& c, const DeviceProfile& prof, int gpus) {
  Prediction out;
  out.candidate = c;
  const int p = std::max(1, c.cp);
  out.data_parallel = std::max(1, gpus / p);
  out.sequences = (w.batch + out.data_parallel - 1) / out.data_parallel;
  const double N = static_cast<double>(w.seq_len);
  const double n = N / p;
  const double ab = prof.activation_bytes;
  const bool megatron = c.stack != Stack::kHyScale;
  const int64_t split = CpShards(c.layout, p);
  if (w.seq_len % split != 0) {
    out.rejected =
        absl::StrCat("data.seq_len ", w.seq_len, " does not split into ", split, " equal shards");
  }

  // Dense matmuls, per layer: every weight is touched once per token (2 FLOPs each).
  const double d = w.d_model, H = w.heads, dqk = w.head_dim_qk, dv = w.head_dim_v;
  const double hi = w.indexer_heads, di = w.indexer_dim;
  const double q_side = d * H * dqk + d * hi * di + d * hi;
  // The key side's own features: the keys, and the values unless they are the keys' first ones.
  const double key_elems = w.latent_kv ? dqk : dqk + dv;
  const double per_token_weights = q_side + d * key_elems + H * dv * d + d * di + 3 * d * w.d_ff;
  const double dense_rate = prof.dense_tflops * kTera;
  const double dense_fwd = 2 * per_token_weights * n / dense_rate;
  const double q_proj = 2 * q_side * n / dense_rate;

  // Selection (sparse) or the dense stage's scoring of every earlier key: causal work.
  const double causal = BusiestCausalWork(c.layout, N, p);
  out.imbalance = causal / (N * (N + 1) / 2 / p);
  const double k = std::min<double>(w.topk, N);
  // Index scores at the k selected entries, formed apart from selection: the Megatron-style stack
  // forms them twice for its indexer loss (the KL in forward, again in backward). HyScale forms
  // them inside the index scores' backward (indexer_loss_backward) under FlashTopK's log-sum-exp,
  // and its replay keeps only the indices (the Megatron-style stack re-selects).
  const double score_gather = 2 * hi * di * k * n / (prof.flash_topk_tflops * kTera);
  const double loss_score_gathers = megatron ? 2 : 0;
  // FlashTopK, with bf16 or fp8 scores, or the Megatron-style score table. fp8 selection (HyScale
  // only: the baselines score in bf16 or fp32) rescores the selected keys unquantized for the
  // indexer loss, one score gather more. Megatron-naive scores whole rows: every local query
  // against every key, on every layout.
  const bool fp8 = w.fp8_selection && !megatron;
  const double selection_rate = megatron ? prof.table_topk_tflops
                                : fp8    ? prof.flash_topk_fp8_tflops
                                         : prof.flash_topk_tflops;
  const double selection =
      c.stack == Stack::kMegatronNaive
          ? SelectionFlops(hi, di, n * N) / (prof.naive_topk_tflops * kTera)
          : SelectionFlops(hi, di, causal) / (selection_rate * kTera) + (fp8 ? score_gather : 0);

  // Query chunks (recomputation or a frozen main model).
  const bool frozen = w.indexer_only;
  const double chunk = (c.recompute != Recompute::kNone || frozen) && c.query_chunk > 0
                           ? std::min<double>(static_cast<double>(c.query_chunk), n)
                           : n;
  const double chunks = std::ceil(n / chunk);

  // Attention forward and backward.
  double attn_fwd = 0, attn_bwd = 0;
  const double row_bytes = (dqk + dv) * ab;
  const double hbm = prof.hbm_gbps * kGiga;
  // HyScale's dense stage that trains every weight runs its attention and indexer loss through
  // [H, rows, keys] tables a query chunk, each chunk against the keys up to its last row: half a
  // chunk more than the causal pairs a row. Memory traffic bounds them (bytes a head and table
  // entry below). The frozen warm-up's kernels are priced apart (below).
  const bool dense_tables = !w.sparse && !megatron && !frozen;
  const double table_pairs = causal + n * chunk / 2;
  if (dense_tables) {
    attn_fwd = kDenseTableForwardBytes * H * table_pairs / hbm;
    attn_bwd = kDenseTableBackwardBytes * H * table_pairs / hbm;
  } else if (!w.sparse) {  // dense causal attention (FlashAttention-style)
    const SparseAttentionRate& rate = prof.sparse_attention.at(1);
    attn_fwd = 2 * H * (dqk + dv) * causal / (rate.fwd_tflops * kTera);
    attn_bwd = kBackwardFlops * 2 * H * (dqk + dv) * causal / (rate.bwd_tflops * kTera);
  } else if (megatron) {  // gather keys per query, then matmul-softmax-matmul: measured rates
    const double flops = AttentionFlops(H, dqk, dv, k * n);
    attn_fwd = flops / (prof.gather_fwd_tflops * kTera);
    attn_bwd = kBackwardFlops * flops / (prof.gather_bwd_tflops * kTera);
  } else {
    const SparseAttentionRate& rate = prof.sparse_attention.at(c.group);
    const double issued = AttentionFlops(H, dqk, dv, k * n * c.group / rate.dedup);
    const double loaded = n * k * key_elems * ab / rate.dedup;  // a latent's rows are gathered once
    // A latent at G = 1 takes its own kernels where the profile has their rates.
    const bool latent = w.latent_kv && c.group == 1;
    const double fwd_rate =
        latent && prof.latent_fwd_tflops > 0 ? prof.latent_fwd_tflops : rate.fwd_tflops;
    const double bwd_rate =
        latent && prof.latent_bwd_tflops > 0 ? prof.latent_bwd_tflops : rate.bwd_tflops;
    attn_fwd = std::max(issued / (fwd_rate * kTera), loaded / hbm);
    attn_bwd = std::max(kBackwardFlops * issued / (bwd_rate * kTera), 2 * loaded / hbm);
  }

  // The indexer loss of a sparse stage: the target (attention mass at the k selected keys; the
  // Megatron-style stack computes it like its gather attention) in forward, the index scores'
  // backward in backward. Replay saves the target, so recomputation does not pay it again. A
  // latent at G = 1 forms the target inside its backward instead (latent_mass_tflops), with or
  // without recomputation.
  double loss_fwd = 0, loss_bwd = 0;
  // The dense tables' indexer loss: the index scores, the target and the KL with their backward,
  // in the recomputation and the backward.
  if (dense_tables) loss_bwd = kDenseIndexerTableBytes * hi * table_pairs / hbm;
  if (w.sparse) {
    const double mass = IndexerMassFlops(H, dqk, k * n);
    const bool target_in_backward =
        !megatron && w.latent_kv && c.group == 1 && prof.latent_mass_tflops > 0;
    if (target_in_backward) {
      loss_bwd = mass / (prof.latent_mass_tflops * kTera);
    } else {
      loss_fwd = mass / ((megatron ? prof.gather_fwd_tflops : prof.indexer_mass_tflops) * kTera);
    }
    loss_bwd += IndexScoreBackwardFlops(hi, di, k * n) / (prof.index_score_bwd_tflops * kTera);
  }

  // Kernel calls: one per run of consecutive positions, per kernel (selection and attention in
  // forward, in backward, and again when recomputing).
  const double calls = c.recompute == Recompute::kNone ? 4 : 6;
  // Each query chunk calls every kernel again, and the key side's projections (forward) are
  // recomputed once more to rebuild their graph.
  const double launches = (Runs(c.layout, n) + chunks - 1) * calls * prof.kernel_launch_s;

  // Communication of the key side, per layer.
  const double idx_elems = di;
  const double gather_all = RingSeconds(N * (key_elems + idx_elems) * ab, p, prof);
  const double gather_idx = RingSeconds(N * idx_elems * ab, p, prof);
  const double gather_kv = RingSeconds(N * key_elems * ab, p, prof);
  const auto exposed_gather = [&](double hidden_by_selection) {
    if (c.indexer == IndexerGroup::kShared) return std::max(0.0, gather_all - q_proj);
    return std::max(0.0, gather_idx - q_proj) + std::max(0.0, gather_kv - hidden_by_selection);
  };
  const double gather_s = c.indexer == IndexerGroup::kShared ? gather_all : gather_idx + gather_kv;
  const double reduce_scatter = c.indexer == IndexerGroup::kShared ? gather_all : gather_s;

  double recompute = 0, recompute_exposed = 0, recompute_comm = 0;
  if (c.recompute != Recompute::kNone) {
    const bool reselect = c.recompute == Recompute::kReselect;
    const double key_side = chunks > 1 ? 2 * d * (key_elems + di) * n / dense_rate : 0;
    const double reselection = reselect ? selection : 0;
    recompute = dense_fwd + key_side + attn_fwd + reselection;
    recompute_exposed = exposed_gather(reselection);
    recompute_comm = gather_s;
  }

  const double layer_dense = 3 * dense_fwd;
  const double layer_selection = selection + loss_score_gathers * score_gather;
  const double layer_attention = attn_fwd + attn_bwd;
  const double layer_exposed = exposed_gather(selection) + reduce_scatter + recompute_exposed;
  const double per_layer = w.layers * static_cast<double>(out.sequences);
  // Embedding lookups are free; the untied lm_head is a matmul with its backward.
  const double logits = 3 * 2 * d * w.vocab * n / dense_rate;

  // Weight gradients: all-reduced over every GPU of the job, behind the backward compute.
  const double backward =
      per_layer * (2 * dense_fwd + attn_bwd + loss_score_gathers * score_gather + loss_bwd);
  const double allreduce =
      gpus > 1 ? 2 * RingSeconds(static_cast<double>(w.parameters) * ab, gpus, prof) : 0;

  out.layer = {{"dense_fwd", dense_fwd},
               {"selection", selection},
               {"score_gather", score_gather},
               {"indexer_loss_fwd", loss_fwd},
               {"indexer_loss_bwd", loss_bwd},
               {"attention_fwd", attn_fwd},
               {"attention_bwd", attn_bwd},
               {"recompute", recompute},
               {"launches", launches},
               {"gather", gather_s},
               {"gather_exposed", exposed_gather(selection)},
               {"recompute_gather_exposed", recompute_exposed},
               {"reduce_scatter", reduce_scatter}};
  out.seconds["dense"] = per_layer * layer_dense + out.sequences * logits;
  out.seconds["selection"] = per_layer * layer_selection;
  out.seconds["attention"] = per_layer * layer_attention;
  out.seconds["indexer_loss"] = per_layer * (loss_fwd + loss_bwd);
  out.seconds["recompute"] = per_layer * recompute;
  out.seconds["launches"] = per_layer * launches;
  out.compute_s = 0;
  for (const auto& [term, s] : out.seconds) out.compute_s += s;
  out.exposed_comm_s = per_layer * layer_exposed + std::max(0.0, allreduce - backward);
  out.comm_s = per_layer * (gather_s + reduce_scatter + recompute_comm) + allreduce;
  if (frozen) {
    // INDEXER_ONLY: the forward alone, the indexer's loss and its backward inside it; no
    // recomputation, no backward of the main model, only the indexer keys' gradient travels. A
    // dense stage (worker/model DsaLayer::frozen_dense_attention) takes its output from the sparse
    // attention kernels over each row's causal prefix and its loss from dense_indexer_kl: the
    // attention's scores, the target, the index scores, the KL and the index scores' backward over
    // every visible pair, at the profile's rate for that op (dense_indexer_loss_tflops, which
    // hyscale-calibrate measures). The step reports no LM loss (the frozen model's does not
    // change), so it forms no logits and the last layer's output has no reader: that layer runs
    // only its projections and its loss, which then forms the attention's log-sum-exps itself on
    // the target's tiles (QK^T alone, at the same op's rate: 1.32 s a step at 128K on an H100,
    // results/dense_warmup_128k_h100_no_logits.txt).
    const double seqs = static_cast<double>(out.sequences);
    const double last_layer_proj = q_proj + 2 * d * (key_elems + di) * n / dense_rate;
    double attention = per_layer * attn_fwd,
           indexer = per_layer * (selection + loss_fwd + loss_bwd);
    if (!w.sparse && !megatron) {
      const double fwd_tflops = w.latent_kv && prof.latent_fwd_tflops > 0
                                    ? prof.latent_fwd_tflops
                                    : prof.sparse_attention.at(1).fwd_tflops;
      const double loss_rate = prof.dense_indexer_loss_tflops * kTera;
      attention = seqs * (w.layers - 1) * 2 * H * (dqk + dv) * causal / (fwd_tflops * kTera);
      indexer = (per_layer * DenseIndexerLossFlops(H, dqk, hi, di, causal) +
                 seqs * 2 * H * dqk * causal) /
                loss_rate;
    }
    const double indexer_keys_back = RingSeconds(N * idx_elems * ab, p, prof);
    out.seconds = {{"dense", seqs * ((w.layers - 1) * dense_fwd + last_layer_proj)},
                   {"attention", attention},
                   {"indexer_loss", indexer},
                   {"launches", per_layer * launches}};
    out.compute_s = 0;
    for (const auto& [term, s] : out.seconds) out.compute_s += s;
    const double indexer_allreduce =
        gpus > 1 ? 2 * RingSeconds(hi * di * d * static_cast<double>(w.layers) * ab, gpus, prof)
                 : 0;
    out.exposed_comm_s =
        per_layer * (exposed_gather(selection) + indexer_keys_back) + indexer_allreduce;
    out.comm_s = per_layer * (gather_s + indexer_keys_back) + indexer_allreduce;
  }
  // The optimizer steps what the stage trains, once a step whatever the sequences.
  const double trained = static_cast<double>(frozen ? w.indexer_parameters : w.parameters);
  out.seconds["optimizer"] = trained * prof.optimizer_bytes_per_parameter / hbm;
  out.compute_s += out.seconds["optimizer"];
  out.seconds["exposed_comm"] = out.exposed_comm_s;
  out.step_s = out.compute_s + out.exposed_comm_s;

  // Memory of one GPU.
  StepSizes sizes;
  sizes.seqs = static_cast<double>(out.sequences);
  sizes.layers = static_cast<double>(w.layers);
  sizes.N = N;
  sizes.n = n;
  sizes.chunk = chunk;
  sizes.chunks = chunks;
  sizes.d = d;
  sizes.H = H;
  sizes.dqk = dqk;
  sizes.dv = dv;
  sizes.hi = hi;
  sizes.di = di;
  sizes.k = k;
  sizes.key_elems = key_elems;
  sizes.ab = ab;
  sizes.row_bytes = row_bytes;
  // Top-k indices kept for replay, as HyScale packs them (worker/model/index_packing.h): 2 bytes
  // an entry up to 65,535 keys, else 3.
  sizes.packed = N <= 65535 ? 2 : 3;
  // A dense query row's score tables (autograd keeps about half of them); frozen, its key lists.
  const bool dense_hyscale = !w.sparse && !megatron;
  sizes.dense_table_row = !dense_hyscale ? 0
                          : frozen       ? N * kFrozenDenseRowKeyBytes
                                         : DenseTableRowBytes(w);
  sizes.dense_backward_row = dense_hyscale && !frozen ? DenseBackwardRowBytes(w, ab) : 0;
  sizes.megatron = megatron;
  sizes.frozen = frozen;
  const bool recomputed = !megatron && !frozen && c.recompute != Recompute::kNone;
  MemoryBreakdown& mem = out.memory;
  mem = recomputed ? RecomputedStepMemory(w, c, prof, sizes) : StoredStepMemory(w, c, prof, sizes);
  // The models not fitted to measured peaks keep 10 % for the allocator: the Megatron-style
  // stacks and HyScale's dense stage that trains every weight. The others are fitted: the
  // recomputed step, the sparse step without recomputation (H100s, 24K-48K) and the frozen
  // warm-up (32K whole and 128K in chunks, docs/performance.md section 13).
  const bool fitted = recomputed || (!megatron && w.sparse && !frozen) || (dense_hyscale && frozen);
  const double slack = fitted ? 1 : 1.1;
  mem.total = slack * (mem.weights + mem.activations + mem.indices + mem.gathered + mem.workspace);
  if (out.rejected.empty() && mem.total > prof.memory_bytes) {
    out.rejected = absl::StrFormat(
        "memory %.1f GiB > %.1f GiB of %s (activations %.1f GiB, weights+optimizer %.1f GiB)",
        mem.total / kGiB, prof.memory_bytes / kGiB, prof.name, mem.activations / kGiB,
        mem.weights / kGiB);
  }
  return out;
}

Prediction PredictFitted(const Workload& work, const Candidate& candidate,
                         const DeviceProfile& profile, int gpus) {
  Prediction whole = Predict(work, candidate, profile, gpus);
  const int64_t local = std::max<int64_t>(1, work.seq_len / std::max(1, candidate.cp));
  // The frozen dense warm-up's key lists grow with every row, its speed does not beyond a few:
  // it runs whole only where they fit kFrozenKeyListBytes, even where the whole fits (at 128K on
  // the H200, 23.34 s whole at 98 GiB, 23.28 s in chunks of 1980 at 7.75 GiB: docs/performance.md
  // section 13). A dense stage that trains every weight takes the largest chunk that fits: its
  // per-token work (projections, MLP) runs a chunk at a time and is slow in small ones (H100, the
  // 2048x4 model at 32K: 23.6 s a step in chunks of 64).
  const bool frozen_dense = work.indexer_only && !work.sparse;
  const double key_list_row = frozen_dense
                                  ? static_cast<double>(work.seq_len) * kFrozenDenseRowKeyBytes *
                                        static_cast<double>(work.batch)
                                  : 0;
  const bool whole_fits =
      whole.memory.total <= profile.memory_bytes &&
      !(frozen_dense && static_cast<double>(local) * key_list_row > kFrozenKeyListBytes);
  // Query-chunked layers are HyScale's (the Megatron-style stacks hold whole sequences).
  if ((candidate.recompute == Recompute::kNone && !work.indexer_only) ||
      candidate.stack != Stack::kHyScale || candidate.query_chunk > 0 || whole_fits) {
    return whole;
  }
  Prediction fitted = whole;
  const int64_t smallest = work.sparse ? kMinQueryChunk : kMinDenseQueryChunk;
  int64_t largest = smallest;
  while (largest * 2 < local) largest *= 2;
  while (largest > smallest && static_cast<double>(largest) * key_list_row > kFrozenKeyListBytes) {
    largest /= 2;
  }
  for (int64_t chunk = largest; chunk >= smallest && chunk < local; chunk /= 2) {
    Candidate c = candidate;
    c.query_chunk = chunk;
    fitted = Predict(work, c, profile, gpus);
    if (fitted.memory.total <= profile.memory_bytes) break;
  }
  return fitted;
}

Prediction PredictJob(const v1::JobSpec& spec, const Candidate& candidate,
                      const DeviceProfile& profile, int gpus, std::vector<Prediction>* stages) {
  Prediction job = PredictFitted(Workload::Of(spec), candidate, profile, gpus);
  if (stages != nullptr) stages->clear();
  if (spec.stages_size() < 2) {
    job.job_s =
        job.step_s * static_cast<double>(spec.stages_size() == 1 ? spec.stages(0).steps() : 1);
    if (stages != nullptr && spec.stages_size() == 1) stages->push_back(job);
    return job;
  }
  for (int i = 0; i < spec.stages_size(); ++i) {
    const Prediction stage = PredictFitted(Workload::OfStage(spec, i), candidate, profile, gpus);
    if (job.rejected.empty() && !stage.rejected.empty()) {
      job.rejected = absl::StrCat("stage '", spec.stages(i).name(), "': ", stage.rejected);
    }
    if (stage.memory.total > job.memory.total) job.memory = stage.memory;
    job.job_s += static_cast<double>(spec.stages(i).steps()) * stage.step_s;
    if (stages != nullptr) stages->push_back(stage);
  }
  return job;
}

}  // namespace hyscale::server::planner
