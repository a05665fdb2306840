// hyscale-calibrate: measures the planner's device figures (planner/profile.h) on this
// machine's device and writes them as a calibration file for `hyscale plan --calibration` and
// `hyscaled --calibration`.
//
// Exit codes: 0 written; 1 a measurement or the write failed; 2 bad flags (the message names the
// flag).
#include <ATen/Context.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "proto/constants.h"
#include "worker/calibrate/benchmarks.h"
#include "worker/calibrate/calibration.h"
#include "worker/calibrate/device.h"
#include "worker/calibrate/optimizer_benchmark.h"
#include "worker/calibrate/shapes.h"

#ifdef HYSCALE_HAVE_CUDA
#include "kernels/cuda/flash_topk_cuda.h"
#endif

#ifndef HYSCALE_CALIBRATE_COMMIT
#define HYSCALE_CALIBRATE_COMMIT ""
#endif

namespace hyscale::calibrate {
namespace {

struct Flags {
  std::string out;
  bool quick = false;
  std::string device = "auto";
  std::optional<int64_t> seq_len, selection_seq_len, topk;
  std::optional<int> runs;
};

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "hyscale-calibrate: %s\n", message.c_str());
  return kExitBadInput;
}

// The flags' checks beyond CLI11's ranges: the shapes must make sense together and on the device.
std::optional<std::string> CheckShapes(const Shapes& s, const c10::Device& device) {
  if (s.topk > s.seq_len) {
    return absl::StrCat("--topk: must be at most --seq-len (", s.seq_len, "), got ", s.topk);
  }
  if (s.topk > s.selection_seq_len) {
    return absl::StrCat("--topk: must be at most --selection-seq-len (", s.selection_seq_len,
                        "), got ", s.topk);
  }
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda() && s.topk > cuda::kMaxTopk) {
    return absl::StrCat("--topk: the CUDA kernels take at most ", cuda::kMaxTopk, ", got ", s.topk);
  }
#else
  (void)device;
#endif
  return std::nullopt;
}

std::string MeasuredGroups(const Calibration& c) {
  std::vector<int> groups;
  for (const auto& m : c.sparse_attention) groups.push_back(m.group);
  return absl::StrJoin(groups, ", ");
}

void Report(const char* figure, double value, const char* unit, double seconds) {
  std::printf("%-25s %12.4g %-8s (median %.3f ms)\n", figure, value, unit, seconds * 1e3);
  std::fflush(stdout);
}

int Run(const Flags& flags) {
  const std::filesystem::path out(flags.out);
  const std::filesystem::path dir = out.has_parent_path() ? out.parent_path() : ".";
  if (!std::filesystem::is_directory(dir)) {
    return BadFlag(absl::StrCat("--out: directory '", dir.string(), "' does not exist"));
  }
  auto device = ResolveDevice(flags.device);
  if (!device.ok()) return BadFlag(std::string(device.status().message()));
  Shapes shapes = DefaultShapes(device->is_cuda(), flags.quick);
  if (flags.seq_len) shapes.seq_len = *flags.seq_len;
  // One length given: both benchmarks use it, unless the selection's is given too.
  shapes.selection_seq_len = flags.selection_seq_len ? *flags.selection_seq_len
                             : flags.seq_len         ? *flags.seq_len
                                                     : shapes.selection_seq_len;
  if (flags.topk) shapes.topk = *flags.topk;
  if (flags.runs) shapes.runs = *flags.runs;
  shapes.gather_rows = std::min(shapes.gather_rows, shapes.seq_len);
  shapes.dense_loss_seq_len = std::min(shapes.dense_loss_seq_len, shapes.seq_len);
  if (auto error = CheckShapes(shapes, *device)) return BadFlag(*error);

  Calibration c;
  c.device_name = DeviceName(*device);
  c.device = ProfileName(c.device_name);
  c.commit = HYSCALE_CALIBRATE_COMMIT;
  c.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  c.shapes = shapes;
  std::printf(
      "hyscale-calibrate: %s, N = %ld (selection %ld, dense loss %ld), k = %ld, H = %ld, "
      "d_qk = %ld, d_v = %ld, H_I = %ld, d_I = %ld; median of %d runs after %d warm-up\n",
      c.device_name.c_str(), shapes.seq_len, shapes.selection_seq_len, shapes.dense_loss_seq_len,
      shapes.topk, shapes.heads, shapes.dim_qk, shapes.dim_v, shapes.indexer_heads,
      shapes.indexer_dim, shapes.runs, shapes.warmup);
  try {
    at::manual_seed(0);
    const Benchmarks bench(*device, shapes);
    c.dense = bench.Dense();
    Report("dense_tflops", c.dense.Rate() / 1e12, "TFLOP/s", c.dense.seconds);
    c.copy = bench.Copy();
    Report("hbm_gbps", c.copy.Rate() / 1e9, "GB/s", c.copy.seconds);
    c.flash_topk = bench.FlashTopk();
    Report("flash_topk_tflops", c.flash_topk.Rate() / 1e12, "TFLOP/s", c.flash_topk.seconds);
    c.flash_topk_fp8 = bench.FlashTopk(/*fp8=*/true);
    Report("flash_topk_fp8_tflops", c.flash_topk_fp8.Rate() / 1e12, "TFLOP/s",
           c.flash_topk_fp8.seconds);
    c.table_topk = bench.TableTopk();
    Report("table_topk_tflops", c.table_topk.Rate() / 1e12, "TFLOP/s", c.table_topk.seconds);
    for (int group : bench.Groups()) {
      c.sparse_attention.push_back(bench.SparseAttention(group));
      const auto& m = c.sparse_attention.back();
      std::printf("sparse_attention G=%-2d dedup %.2f\n", group, m.dedup);
      Report("  fwd_tflops", m.fwd.Rate() / 1e12, "TFLOP/s", m.fwd.seconds);
      Report("  bwd_tflops", m.bwd.Rate() / 1e12, "TFLOP/s", m.bwd.seconds);
    }
    if (shapes.dim_v <= shapes.dim_qk) {
      c.latent = bench.Latent();
      Report("latent_fwd_tflops", c.latent->fwd.Rate() / 1e12, "TFLOP/s", c.latent->fwd.seconds);
      Report("latent_bwd_tflops", c.latent->bwd.Rate() / 1e12, "TFLOP/s", c.latent->bwd.seconds);
      Report("latent_mass_tflops", c.latent->target.Rate() / 1e12, "TFLOP/s",
             c.latent->target.seconds);
    }
    c.gather = bench.Gather();
    Report("gather_fwd_tflops", c.gather.fwd.Rate() / 1e12, "TFLOP/s", c.gather.fwd.seconds);
    Report("gather_bwd_tflops", c.gather.bwd.Rate() / 1e12, "TFLOP/s", c.gather.bwd.seconds);
    c.indexer_loss = bench.IndexerLoss();
    Report("indexer_mass_tflops", c.indexer_loss.mass.Rate() / 1e12, "TFLOP/s",
           c.indexer_loss.mass.seconds);
    Report("index_score_bwd_tflops", c.indexer_loss.score_bwd.Rate() / 1e12, "TFLOP/s",
           c.indexer_loss.score_bwd.seconds);
    c.dense_indexer_loss = bench.DenseIndexerLoss();
    Report("dense_indexer_loss_tflops", c.dense_indexer_loss.Rate() / 1e12, "TFLOP/s",
           c.dense_indexer_loss.seconds);
    c.optimizer = OptimizerStep(*device, shapes);
    Report("optimizer_bytes_per_parameter", OptimizerBytesPerParameter(c), "B",
           c.optimizer.seconds);
    c.kernel_launch_s = bench.KernelLaunch();
    Report("kernel_launch_s", c.kernel_launch_s, "s", c.kernel_launch_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyscale-calibrate: measurement failed: %s\n", e.what());
    return kExitFailed;
  }

  c.notes.push_back(
      "collective figures (intra_node_gbps, inter_node_gbps, collective_latency_s, "
      "collective_efficiency) not measured: this run is a single rank, and a calibration file "
      "does not carry them; the built-in profile's values stay");
  if (!device->is_cuda()) {
    c.notes.push_back(
        "sparse_attention: G = 1 only (the CPU reference op has no query groups); other G keep "
        "the built-in profile's figures");
  } else if (c.sparse_attention.size() < std::size(kQueryGroups)) {
    c.notes.push_back(absl::StrCat("sparse_attention: only G = ", MeasuredGroups(c),
                                   " (the kernels take G * k <= 32768); other G keep the "
                                   "built-in profile's figures"));
  }
  c.notes.push_back(absl::StrCat(
      "sparse_attention: local (trained-like) selections as bench/sparse_attn_bench.py draws them; "
      "dedup = valid slots / union entries; TFLOP/s on executed FLOPs (G queries x the union)"));
  c.notes.push_back(
      c.latent ? "latent: sparse_attn_latent at G = 1 on the same selections, values the keys' "
                 "first d_v columns; TFLOP/s on useful FLOPs"
               : "latent: not measured (d_v > d_qk); the built-in profile's figures stay");
  c.notes.push_back(absl::StrCat("gather: the last ", shapes.gather_rows,
                                 " queries (full windows), blocks of ", shapes.gather_chunk,
                                 "; bwd = fwd+bwd by autograd minus fwd"));
  c.notes.push_back(absl::StrCat(
      "indexer_mass / index_score_bwd: flash_topk's causal selections of random indexer inputs at "
      "N = ",
      shapes.seq_len, "; FLOPs per slot, all N k of them (as the cost model counts k a query): ",
      "2 H d_qk for the mass, 4 H_I d_I for the backward (indexer_loss_backward, the trainer's)"));
  c.notes.push_back(absl::StrCat(
      "dense_indexer_loss: dense_indexer_kl on one causal sequence of random inputs at N = ",
      shapes.dense_loss_seq_len, " with the attention's lse given, as the trainer gives it",
      "; FLOPs (2 H d_qk + 6 H_I d_I) per visible pair, N(N+1)/2 of them"));
  c.notes.push_back(absl::StrCat(
      "optimizer: the trainer's AdamW step with gradient clipping over ",
      shapes.optimizer_parameters,
      " fp32 parameters (fused on CUDA with libtorch 2.x); bytes a parameter = its time at the "
      "copy's bandwidth"));
  c.notes.push_back(
      absl::StrCat("flash_topk / table_topk: random (untrained-indexer) inputs at N = ",
                   shapes.selection_seq_len,
                   "; FLOPs H_I d_I N(N+1) for both; rates grow with N (docs/performance.md "
                   "section 5)"));
  if (flags.quick) {
    c.notes.push_back("--quick: tiny shapes for tests; the rates do not represent training");
  }
  if (auto status = WriteCalibration(flags.out, ToProto(c)); !status.ok()) {
    std::fprintf(stderr, "hyscale-calibrate: %s\n", std::string(status.message()).c_str());
    return kExitFailed;
  }
  std::printf("hyscale-calibrate: wrote %s (device %s)\n", flags.out.c_str(), c.device.c_str());
  return kExitOk;
}

}  // namespace
}  // namespace hyscale::calibrate

int main(int argc, char** argv) {
  hyscale::calibrate::Flags flags;
  CLI::App app{"hyscale-calibrate: measures the planner's device figures on this machine"};
  app.add_option("--out", flags.out, "Calibration file to write (JSON, planner/profile.h)")
      ->required();
  app.add_flag("--quick", flags.quick, "Tiny shapes (for tests): seconds, not representative");
  app.add_option("--device", flags.device, "auto (CUDA when built with it and present), cpu, cuda")
      ->capture_default_str();
  app.add_option("--seq-len", flags.seq_len,
                 "N of sparse attention, the gather baseline and the indexer loss (and of "
                 "selection, unless --selection-seq-len); it also caps the dense warm-up "
                 "loss's N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--selection-seq-len", flags.selection_seq_len,
                 "N of FlashTopK and the score table")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--topk", flags.topk, "k of selection and sparse attention")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--runs", flags.runs, "Timed runs per figure (the median is kept)")
      ->check(CLI::Range(1, 1000));
  app.footer("Exit codes:\n  0  written\n  1  a measurement or the write failed\n  2  bad flags");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? hyscale::kExitOk : hyscale::kExitBadInput;
  }
  return hyscale::calibrate::Run(flags);
}
