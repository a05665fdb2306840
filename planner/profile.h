// Device profiles of the planner's cost model: kernel throughputs, memory and link bandwidths of
// one device kind, each figure with where it comes from. The built-in table (profile.cc) holds
// h200, h800, h20 and cpu; a calibration file measured on a worker's device replaces figures of a
// profile (ApplyCalibration).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <map>
#include <string>
#include <vector>

#include "proto/constants.h"

namespace hyscale::server::planner {

// Sparse attention at one query group size G.
struct SparseAttentionRate {
  // On the FLOPs executed: G queries x the union of their keys, masked pairs included.
  double fwd_tflops = 0;
  double bwd_tflops = 0;
  // Keys loaded per group: G x k / dedup (1 at G = 1: no sharing).
  double dedup = 1;
};

struct DeviceProfile {
  std::string name;
  double memory_bytes = 0;  // usable device memory
  double dense_tflops = 0;  // model matmuls (projections, MLP)
  double hbm_gbps = 0;      // device memory bandwidth, GB/s
  // FlashTopK (scoring + exact top-k; FLOPs counted as H_I * d_I * N(N+1) for a causal N).
  double flash_topk_tflops = 0;
  // The same with fp8 scoring (model.indexer.fp8_scores), FLOPs counted alike.
  double flash_topk_fp8_tflops = 0;
  // The Megatron-style selection: fused scoring into an fp32 table, then torch.topk.
  double table_topk_tflops = 0;
  // Megatron-naive selection: fp32 einsum table over whole rows, then torch.topk (FLOPs counted
  // over every (query, key) pair it scores, masked ones included).
  double naive_topk_tflops = 0;
  std::map<int, SparseAttentionRate> sparse_attention;  // by G
  // Sparse attention with the values inside the keys (model.latent_kv) at G = 1, which has its own
  // kernels: the warp-specialized forward and the one-kernel backward (0: the G = 1 rates apply).
  double latent_fwd_tflops = 0;
  double latent_bwd_tflops = 0;
  // Megatron-style attention: gather the selected keys, then matmul-softmax-matmul (useful FLOPs).
  double gather_fwd_tflops = 0;
  double gather_bwd_tflops = 0;
  // The sparse stage's indexer loss: its target, the attention mass at the k selected keys
  // (2 H d_qk k FLOPs a query), and the backward of the index scores into q_I and k_I
  // (4 H_I d_I k FLOPs a query; tensor cores, reductions into the shared keys).
  double indexer_mass_tflops = 0;
  double index_score_bwd_tflops = 0;
  // The same target formed inside the latent backward (a latent at G = 1, with recomputation):
  // its FLOPs as above over the time it adds to that backward.
  double latent_mass_tflops = 0;
  // The dense warm-up's indexer loss (an INDEXER_ONLY dense stage: dense_indexer_kl over every
  // visible key), all of it at one rate: DenseIndexerLossFlops (flops.h) over its time.
  double dense_indexer_loss_tflops = 0;
  // The trainer's optimizer step (worker/trainer/optimizer.h, adamw_step) in bytes of device
  // memory traffic a trained parameter, at hbm_gbps: its time over what it trains.
  double optimizer_bytes_per_parameter = 0;
  double kernel_launch_s = 0;       // fixed cost of one kernel call (round-robin pays it per token)
  double topk_scratch_bytes = 0;    // FlashTopK scratch besides its O(n k) candidates
  int devices_per_node = 1;         // devices joined by the fast link
  double intra_node_gbps = 0;       // per device, one direction (NVLink)
  double inter_node_gbps = 0;       // per device, one direction (InfiniBand)
  double collective_latency_s = 0;  // per ring step of a collective
  double collective_efficiency = 1;  // achieved / link bandwidth for ring collectives
  double activation_bytes = 2;       // bytes per activation element (bf16 on GPUs, fp32 on CPU)
  // Figure name -> where it comes from: "measured: ...", "published: ..." or "assumption: ...".
  std::map<std::string, std::string> sources;
};

// The usable memory of a device of `device_bytes` (published or reported capacity): 5 % less for
// the CUDA context and fragmentation (an assumption every GPU profile makes).
double UsableMemoryBytes(double device_bytes);

// The built-in profile `name` ("h200", "h800", "h20", "cpu"); NotFound lists the known names.
absl::StatusOr<DeviceProfile> BuiltinProfile(const std::string& name);
std::vector<std::string> BuiltinProfileNames();
// The built-in profile whose figures stand for a GPU of this name, as nvidia-smi reports it
// ("NVIDIA H200" -> h200; H100 SXM and H800 -> h800, the same SXM parts; H20 -> h20), or empty:
// other cards, and the PCIe and NVL variants, whose clocks and power the profiles do not model.
std::string BuiltinProfileOfDevice(const std::string& device_name);

// Replaces figures of `profile` with those in a calibration file written by a micro-benchmark on
// the worker's device: a hyscale.v1.Calibration (proto/hyscale/v1/calibration.proto) in
// protobuf's JSON mapping, e.g.
//   {"device": "h200", "source": "bench/... at <commit>", "flash_topk_tflops": 512,
//    "sparse_attention": [{"group": 4, "fwd_tflops": 500, "bwd_tflops": 200, "dedup": 3.4}]}
// Every figure is optional; an unknown field, a value of the wrong type, a figure not > 0 or a
// group outside kQueryGroups is an error naming it, and then no figure changes. Each replaced
// figure's source becomes "calibrated: <source>". The descriptive fields (device_name, commit,
// date, shapes, measurements, notes) are for people.
absl::Status ApplyCalibration(const std::string& json_text, DeviceProfile* profile);
absl::Status LoadCalibration(const std::string& path, DeviceProfile* profile);
// Replaces the sparse attention's dedup(G) with a job's measured key sharing (its evaluations'
// key_sharing: G adjacent queries' selected keys over their distinct keys), written
// "G=ratio[,G=ratio..]", e.g. "4=1.5,16=2.9": the keys a query group loads once are the job's
// own, not the calibration's synthetic selections'. G must be a query group above 1 that the
// profile has rates for and the ratio within [1, G]; otherwise an error naming the item, and
// then no figure changes. Each replaced figure's source becomes "measured key sharing".
absl::Status ApplyKeySharing(const std::string& text, DeviceProfile* profile);

// The "device" a calibration file names ("" when none), to pick the profile it calibrates.
absl::StatusOr<std::string> CalibrationDevice(const std::string& path);

}  // namespace hyscale::server::planner
