// The micro-benchmarks behind each figure of a calibration file, with the FLOP counts of the
// planner's cost model (planner/flops.h), so a rate here is the rate the model divides by.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "worker/calibrate/shapes.h"
#include "worker/calibrate/timer.h"

namespace hyscale::calibrate {

// One timed call: median seconds and the work it counts (FLOPs, or bytes for a copy).
struct Measurement {
  double seconds = 0;
  double work = 0;
  double Rate() const { return work / seconds; }
};

struct SparseAttentionMeasurement {
  int group = 1;
  double dedup = 1;
  Measurement fwd, bwd;
};

// The latent's, and what its backward adds when it also forms the indexer's target.
struct LatentMeasurement : SparseAttentionMeasurement {
  Measurement target;
};

struct GatherMeasurement {
  Measurement fwd, bwd;
};

struct IndexerLossMeasurement {
  Measurement mass, score_bwd;
};

class Benchmarks {
 public:
  // Inputs are drawn on `device` in the model's dtype there: bf16 on a GPU, fp32 on the CPU.
  Benchmarks(c10::Device device, const Shapes& shapes);

  // bf16 (GPU) or fp32 (CPU) n x n x n matmul: 2 n^3 FLOPs.
  Measurement Dense() const;
  // Device-to-device copy: bytes read + written.
  Measurement Copy() const;
  // hyscale::flash_topk over a causal sequence of selection_seq_len: 2 H_I d_I N(N+1)/2 FLOPs;
  // with `fp8`, its fp8 scoring (quantization included), FLOPs counted alike.
  Measurement FlashTopk(bool fp8 = false) const;
  // The Megatron-style selection with the same FLOP count: an fp32 score table block by block
  // (our index_score_table op on CUDA, a matmul on the CPU), then topk.
  Measurement TableTopk() const;
  // The G values the device's sparse attention kernels take at this topk: 1, 2, 4, 8, 16 (G*k at
  // most 32768) on CUDA; 1 on the CPU (its reference op has no query groups).
  std::vector<int> Groups() const;
  // hyscale sparse attention at query group G on local selections; FLOPs executed: G queries x
  // the union of their keys (profile.h), backward x kBackwardFlops.
  SparseAttentionMeasurement SparseAttention(int group) const;
  // hyscale::sparse_attn_latent (the values are the keys' first d_v columns, d_v <= d_qk) at
  // G = 1 on the same selections: on CUDA its own kernels (the warp-specialized forward and the
  // one-kernel backward), which the planner prices for model.latent_kv. FLOPs as SparseAttention's.
  // The target: the backward with the indexer's target (sparse_attn_latent_backward_target) less
  // the backward, 2 H d_qk FLOPs per slot (every one of the N k, as IndexerLoss counts).
  LatentMeasurement Latent() const;
  // Gather the selected keys, matmul-softmax-matmul; backward by autograd (fwd+bwd minus fwd).
  // Useful FLOPs on the valid pairs, backward x kBackwardFlops.
  GatherMeasurement Gather() const;
  // The indexer loss's two ops on flash_topk's causal selections of random indexer inputs at
  // seq_len: hyscale::selected_attention_mass (lse from sparse attention on the same selections),
  // 2 H d_qk FLOPs per slot; the loss's backward as the trainer runs it,
  // hyscale::indexer_loss_backward (the scores, the KL and the index scores' backward, under
  // flash_topk's log-sum-exp), 4 H_I d_I per slot. Every one of the N k slots is counted, as the
  // cost model counts k a query.
  IndexerLossMeasurement IndexerLoss() const;
  // The dense warm-up's indexer loss: hyscale::dense_indexer_kl (the frozen attention's target,
  // the index scores, the KL and the indexer's gradients over every visible key) on one causal
  // sequence of dense_loss_seq_len random tokens; DenseIndexerLossFlops over its N(N+1)/2 pairs.
  Measurement DenseIndexerLoss() const;
  // One near-empty op (a one-element add): the fixed cost of a kernel call.
  double KernelLaunch() const;

 private:
  at::TensorOptions Options(c10::ScalarType dtype) const;

  c10::Device device_;
  Shapes shapes_;
  Timer timer_;
  c10::ScalarType dtype_;
  at::Tensor indices_;  // local selections [N, k] int32 on the device
};

}  // namespace hyscale::calibrate
