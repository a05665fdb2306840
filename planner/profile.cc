#include "planner/profile.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/strings/string_view.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "hyscale/v1/calibration.pb.h"
#include "proto/proto_json.h"

namespace hyscale::server::planner {

double UsableMemoryBytes(double device_bytes) {
  return device_bytes * 0.95;
}

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// De-duplication of keys among G adjacent queries: measured on the H200 with local (trained-like)
// selections at 32K (docs/sparse_attn.md); random selections share far less (1.12 .. 2.44).
constexpr double kDedup[] = {1.0, 1.62, 2.37, 3.19, 4.15};

// Rates at G = 1 (on Hopper the wgmma kernels, which take H a multiple of 64, as the GPU profiles
// assume) and at G > 1.
void SetSparse(DeviceProfile* p, double fwd_g1, double bwd_g1, double fwd, double bwd) {
  for (size_t i = 0; i < std::size(kQueryGroups); ++i) {
    p->sparse_attention[kQueryGroups[i]] = {fwd, bwd, kDedup[i]};
  }
  p->sparse_attention[1] = {fwd_g1, bwd_g1, 1.0};
}

// Figures shared by the Hopper profiles (H200, H800 and H20 use the same kernels).
void SetHopperSources(DeviceProfile* p) {
  p->sources["sparse_attention.dedup"] =
      "measured: 1, 1.62, 2.37, 3.19, 4.15 for G = 1..16, local selections at 32K on H200 "
      "(docs/sparse_attn.md); assumed to hold at 1M and on other GPUs";
  p->sources["kernel_launch_s"] = "assumption: 5 us per kernel call";
  p->sources["devices_per_node"] = "published: 8 GPUs per HGX node";
  p->sources["collective_latency_s"] = "assumption: 10 us per ring step";
  p->sources["collective_efficiency"] = "assumption: ring collectives reach 80% of the link";
  p->sources["memory_bytes"] = "published capacity less 5% (assumption: context, fragmentation)";
  p->sources["inter_node_gbps"] = "assumption: one 400 Gb/s InfiniBand NIC per GPU (50 GB/s)";
}

DeviceProfile H200() {
  DeviceProfile p;
  p.name = "h200";
  // nvidia-smi's total (the "141 GB" of the datasheet), less 5 %: the trainer's 132.03 GiB peak
  // at 128K fit (docs/performance.md section 13).
  p.memory_bytes = UsableMemoryBytes(143771.0 * (1 << 20));
  p.dense_tflops = 793;
  p.hbm_gbps = 4000;
  p.flash_topk_tflops = 512;
  p.flash_topk_fp8_tflops = 695;
  p.table_topk_tflops = 304;
  p.naive_topk_tflops = 27.5;
  SetSparse(&p, 251, 94, 127, 72);
  p.latent_fwd_tflops = 581;
  p.latent_bwd_tflops = 304;
  p.gather_fwd_tflops = 72.6;
  p.gather_bwd_tflops = 16.4;
  p.indexer_mass_tflops = 67.7;
  p.index_score_bwd_tflops = 112;
  p.latent_mass_tflops = 1079;
  p.dense_indexer_loss_tflops = 511.1;
  p.optimizer_bytes_per_parameter = 42;
  p.kernel_launch_s = 5e-6;
  p.topk_scratch_bytes = 1 * kGiB;
  p.devices_per_node = 8;
  p.intra_node_gbps = 450;
  p.inter_node_gbps = 50;
  p.collective_latency_s = 10e-6;
  p.collective_efficiency = 0.8;
  p.activation_bytes = 2;
  SetHopperSources(&p);
  p.sources["memory_bytes"] =
      "measured: nvidia-smi's 143,771 MiB less 5% (the trainer's 132.03 GiB peak at 128K fit)";
  p.sources["dense_tflops"] = "measured: bf16 matmul 8192^3 on one H200 (DESIGN.md)";
  p.sources["hbm_gbps"] = "assumption: 83% of the published 4.8 TB/s";
  p.sources["flash_topk_tflops"] =
      "measured: hyscale::flash_topk (bf16 scoring) at N = 256K on H200, 1099 ms "
      "(docs/performance.md section 5)";
  p.sources["flash_topk_fp8_tflops"] =
      "measured: hyscale::flash_topk with fp8 scoring at N = 256K on H200, 810 ms "
      "(docs/performance.md section 5)";
  p.sources["table_topk_tflops"] =
      "measured: score table + torch.topk at N = 256K on H200, 1850 ms (docs/performance.md "
      "section 5)";
  p.sources["naive_topk_tflops"] =
      "measured: Megatron-naive selection at N = 64K on H200, 2559 ms for N^2 scored pairs "
      "(docs/performance.md section 5; 5.11 s for 64K queries x 128K keys under CP, section 12)";
  p.sources["sparse_attention.fwd_tflops"] =
      "measured: hyscale sparse_attn fwd at H = 128 on H200, 251 TFLOP/s at G = 1 and 32K, random "
      "selections (wgmma kernel, separate values; 581 at 128K, local selections, with values "
      "inside the keys, the warp-specialized kernel) and 127 executed at G > 1 "
      "(docs/performance.md section 7; FlashMLA publishes 640 on H800)";
  p.sources["sparse_attention.bwd_tflops"] =
      "measured: hyscale sparse_attn bwd (atomic) at H = 128 on H200, 94 TFLOP/s at G = 1 and "
      "128K, local selections (87 random), 72 at G > 1 and 64K (docs/performance.md section 7)";
  p.sources["latent_fwd_tflops"] =
      "measured: hyscale sparse_attn_latent fwd (warp-specialized kernel) at H = 128, 128K, "
      "local selections on H200, 581 TFLOP/s; 555 with random selections (docs/performance.md "
      "section 7, 7c22698)";
  p.sources["latent_bwd_tflops"] =
      "measured: hyscale sparse_attn_latent bwd (one kernel, atomic, query pairs exchanging "
      "bf16 partials) at H = 128, 128K, local selections on H200, 304 TFLOP/s; 288 with random "
      "selections (docs/performance.md section 7, 2026-12-02)";
  p.sources["gather_fwd_tflops"] = "measured: gather baseline fwd 72.6 TFLOP/s at 32K on H200";
  p.sources["gather_bwd_tflops"] =
      "measured, rough: gather baseline bwd 16.4 TFLOP/s at 64K on H200 (9.3 at 32K; the "
      "faster one, which favours the baseline)";
  p.sources["indexer_mass_tflops"] =
      "measured: selected_attention_mass in the layer step, 585 ms for 128K queries on H200 "
      "(bench/cp_layer_bench.py, docs/performance.md section 12)";
  p.sources["index_score_bwd_tflops"] =
      "measured: index_score_backward on tensor cores (three blocks an SM), 78.4 ms for 128K "
      "queries, k = 2048, on H200 (bench/indexer_loss_bench.py, docs/performance.md section 13, "
      "2026-12-05)";
  p.sources["latent_mass_tflops"] =
      "measured: the target adds 36.7 ms to the latent backward's 668.3 ms at 128K, H = 128, on "
      "H200 (bench/indexer_loss_bench.py, docs/performance.md section 13, 2026-12-05)";
  p.sources["dense_indexer_loss_tflops"] =
      "assumption: the H100's measured 511.1 (same SMs; the H200's own figure predates the "
      "backward from the scores pass's ReLU gates)";
  p.sources["optimizer_bytes_per_parameter"] =
      "measured: adamw_step (ATen's fused AdamW, the clipping as its gradient scale) over 256M "
      "fp32 parameters on H100 SXM, 3.78 ms at its 2986 GB/s copy: 42.05 B (hyscale-calibrate, "
      "2026-12-07, docs/results/calibration_h100_971424d.json); the 783M-parameter reference "
      "model's optimizer phase 11 ms a step there (docs/performance.md section 13)";
  p.sources["intra_node_gbps"] = "published: NVLink 4, 900 GB/s both directions";
  return p;
}

DeviceProfile H800() {
  DeviceProfile p = H200();  // same GH100 compute: kernel rates carry over (assumption)
  p.name = "h800";
  p.memory_bytes = UsableMemoryBytes(80e9);
  p.hbm_gbps = 2780;
  p.intra_node_gbps = 200;
  p.sources["dense_tflops"] = "assumption: the H200's measured 793 (same GH100 SMs and clocks)";
  p.sources["flash_topk_tflops"] = "assumption: the H200's measured 512 (compute-bound, same SMs)";
  p.sources["flash_topk_fp8_tflops"] = "assumption: the H200's measured 695";
  p.sources["table_topk_tflops"] = "assumption: the H200's measured 304";
  p.sources["naive_topk_tflops"] = "assumption: the H200's measured 27.5";
  for (const char* key :
       {"sparse_attention.fwd_tflops", "sparse_attention.bwd_tflops", "latent_fwd_tflops",
        "latent_bwd_tflops", "gather_fwd_tflops", "gather_bwd_tflops", "indexer_mass_tflops",
        "index_score_bwd_tflops", "latent_mass_tflops"}) {
    p.sources[key] = "assumption: the H200's measured figure (same SMs)";
  }
  // The figure both profiles use (511.1) was measured on an H100 SXM (the same GH100 SMs).
  p.sources["dense_indexer_loss_tflops"] =
      "measured: dense_indexer_kl with the attention's lse given (the trainer's path), 2065.1 ms "
      "at 128K, H = 64, d_qk = 576, H_I = 64, d_I = 128, on H100 SXM at 1590 MHz, the backward "
      "from the scores pass's ReLU gates, its tables by TMA, no fills (bench/dense_loss_ab.py, "
      "2026-12-07, docs/results/dense_loss_no_fills_h100.txt)";
  p.sources["hbm_gbps"] = "assumption: 83% of the published 3.35 TB/s";
  p.sources["intra_node_gbps"] = "published: NVLink 400 GB/s both directions";
  return p;
}

DeviceProfile H20() {
  // 148 dense bf16 TFLOP/s against the H200's 989: compute-bound rates scale by 0.15.
  constexpr double kCompute = 148.0 / 989.0;
  DeviceProfile p = H200();
  p.name = "h20";
  p.memory_bytes = UsableMemoryBytes(96e9);
  p.hbm_gbps = 3300;
  SetSparse(&p, 210 * kCompute, 91 * kCompute, 127 * kCompute, 72 * kCompute);
  // The H200's rates (measured, but for the dense warm-up's loss), scaled (fp8 peaks keep the
  // bf16 ratio, 296 / 1979).
  for (double* rate :
       {&p.dense_tflops, &p.flash_topk_tflops, &p.flash_topk_fp8_tflops, &p.table_topk_tflops,
        &p.naive_topk_tflops, &p.latent_fwd_tflops, &p.latent_bwd_tflops, &p.gather_fwd_tflops,
        &p.gather_bwd_tflops, &p.indexer_mass_tflops, &p.index_score_bwd_tflops,
        &p.latent_mass_tflops, &p.dense_indexer_loss_tflops}) {
    *rate *= kCompute;
  }
  const std::string scaled = "assumption: the H200 figure x 148/989 (published dense bf16 peaks)";
  for (const char* key :
       {"dense_tflops", "flash_topk_tflops", "flash_topk_fp8_tflops", "table_topk_tflops",
        "naive_topk_tflops", "sparse_attention.fwd_tflops", "sparse_attention.bwd_tflops",
        "latent_fwd_tflops", "latent_bwd_tflops", "gather_fwd_tflops", "gather_bwd_tflops",
        "indexer_mass_tflops", "index_score_bwd_tflops", "latent_mass_tflops",
        "dense_indexer_loss_tflops"}) {
    p.sources[key] = scaled;
  }
  p.sources["hbm_gbps"] = "assumption: 83% of the published 4.0 TB/s";
  p.sources["intra_node_gbps"] = "published: NVLink 900 GB/s both directions";
  return p;
}

DeviceProfile Cpu() {
  DeviceProfile p;
  p.name = "cpu";
  p.memory_bytes = 64 * kGiB;
  p.dense_tflops = 0.08;
  p.hbm_gbps = 20;
  p.flash_topk_tflops = 0.02;
  p.flash_topk_fp8_tflops = 0.02;  // the CPU quantizes, then scores as without fp8
  p.table_topk_tflops = 0.01;
  p.naive_topk_tflops = 0.01;
  SetSparse(&p, 0.02, 0.01, 0.02, 0.01);
  p.gather_fwd_tflops = 0.02;
  p.gather_bwd_tflops = 0.01;
  p.indexer_mass_tflops = 0.02;
  p.index_score_bwd_tflops = 0.01;
  p.dense_indexer_loss_tflops = 0.01;
  p.optimizer_bytes_per_parameter = 100;
  p.kernel_launch_s = 1e-6;
  p.devices_per_node = 1;
  p.intra_node_gbps = 2;
  p.inter_node_gbps = 2;
  p.collective_latency_s = 50e-6;
  p.collective_efficiency = 0.5;
  p.activation_bytes = 4;
  p.sources["dense_tflops"] =
      "measured: OpenBLAS fp32 1024^3, 80 GFLOP/s (docs/performance.md section 3)";
  const std::string guess = "assumption: CPU reference kernels, not measured";
  for (const char* key :
       {"flash_topk_tflops", "flash_topk_fp8_tflops", "table_topk_tflops", "naive_topk_tflops",
        "sparse_attention.fwd_tflops", "sparse_attention.bwd_tflops", "gather_fwd_tflops",
        "gather_bwd_tflops", "indexer_mass_tflops", "index_score_bwd_tflops",
        "dense_indexer_loss_tflops"}) {
    p.sources[key] = guess;
  }
  p.sources["sparse_attention.dedup"] = "assumption: as on the GPUs";
  p.sources["latent_fwd_tflops"] = "none: the CPU kernels take latents at the G = 1 rates";
  p.sources["latent_bwd_tflops"] = "none: the CPU kernels take latents at the G = 1 rates";
  p.sources["latent_mass_tflops"] =
      "none: the CPU backward's target is selected_attention_mass after it";
  p.sources["memory_bytes"] = "assumption: 64 GiB of host memory per rank";
  p.sources["hbm_gbps"] = "assumption: 20 GB/s of DRAM bandwidth per rank";
  p.sources["optimizer_bytes_per_parameter"] =
      "assumption: libtorch's AdamW, nine element-wise passes over fp32 (88 bytes), and the "
      "clipping's norm and scale (12)";
  p.sources["kernel_launch_s"] = "assumption: 1 us per call";
  p.sources["devices_per_node"] = "one process per rank";
  p.sources["intra_node_gbps"] = "assumption: Gloo over TCP, 2 GB/s";
  p.sources["inter_node_gbps"] = "assumption: Gloo over TCP, 2 GB/s";
  p.sources["collective_latency_s"] = "assumption: 50 us per ring step";
  p.sources["collective_efficiency"] = "assumption: 50% of the link";
  return p;
}

}  // namespace

std::vector<std::string> BuiltinProfileNames() {
  return {"h200", "h800", "h20", "cpu"};
}

std::string BuiltinProfileOfDevice(const std::string& device_name) {
  const std::string name = absl::AsciiStrToUpper(device_name);
  const auto has = [&name](const char* part) { return absl::StrContains(name, part); };
  if (has("PCIE") || has("NVL")) return "";
  if (has("H200")) return "h200";
  if (has("H100") || has("H800")) return "h800";
  if (has("H20")) return "h20";
  return "";
}

absl::StatusOr<DeviceProfile> BuiltinProfile(const std::string& name) {
  if (name == "h200") return H200();
  if (name == "h800") return H800();
  if (name == "h20") return H20();
  if (name == "cpu") return Cpu();
  return absl::NotFoundError(absl::StrCat("unknown device profile '", name, "' (known: ",
                                          absl::StrJoin(BuiltinProfileNames(), ", "), ")"));
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

absl::StatusOr<v1::Calibration> ParseCalibration(std::string_view json_text) {
  v1::Calibration calibration;
  if (auto status = ParseProtoJson(json_text, &calibration); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("calibration: ", status.message()));
  }
  return calibration;
}

// The figures a message of a calibration holds: its optional doubles that are set.
std::vector<const FieldDescriptor*> FiguresSet(const Message& message) {
  std::vector<const FieldDescriptor*> fields, figures;
  message.GetReflection()->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE && field->has_presence()) {
      figures.push_back(field);
    }
  }
  return figures;
}

absl::Status CheckFigures(const Message& message, const std::string& path) {
  for (const FieldDescriptor* field : FiguresSet(message)) {
    const double value = message.GetReflection()->GetDouble(message, field);
    if (!(value > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, field->name(), ": must be a number > 0 (got ", value, ")"));
    }
  }
  return absl::OkStatus();
}

// Sets the profile's figure of each one `message` holds (`targets` by field name), its source
// named `prefix` + the field's name.
void SetFigures(const Message& message, const std::map<std::string, double*>& targets,
                const std::string& prefix, const std::string& source, DeviceProfile* profile) {
  for (const FieldDescriptor* field : FiguresSet(message)) {
    const auto target = targets.find(field->name());
    if (target == targets.end()) continue;  // planner_test checks that every figure has one
    *target->second = message.GetReflection()->GetDouble(message, field);
    profile->sources[prefix + field->name()] = source;
  }
}

}  // namespace

absl::Status ApplyCalibration(const std::string& json_text, DeviceProfile* profile) {
  const auto calibration = ParseCalibration(json_text);
  if (!calibration.ok()) return calibration.status();
  if (auto status = CheckFigures(*calibration, "calibration."); !status.ok()) return status;
  for (int i = 0; i < calibration->sparse_attention_size(); ++i) {
    const auto& row = calibration->sparse_attention(i);
    const std::string at = absl::StrCat("calibration.sparse_attention[", i, "].");
    if (!IsQueryGroup(row.group())) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "group: must be one of ", kQueryGroupsText, " (got ", row.group(), ")"));
    }
    if (auto status = CheckFigures(row, at); !status.ok()) return status;
  }

  const std::string source = absl::StrCat(
      "calibrated: ", calibration->source().empty() ? "micro-benchmark" : calibration->source());
  DeviceProfile& p = *profile;
  SetFigures(*calibration,
             {{"dense_tflops", &p.dense_tflops},
              {"hbm_gbps", &p.hbm_gbps},
              {"flash_topk_tflops", &p.flash_topk_tflops},
              {"flash_topk_fp8_tflops", &p.flash_topk_fp8_tflops},
              {"table_topk_tflops", &p.table_topk_tflops},
              {"naive_topk_tflops", &p.naive_topk_tflops},
              {"gather_fwd_tflops", &p.gather_fwd_tflops},
              {"gather_bwd_tflops", &p.gather_bwd_tflops},
              {"indexer_mass_tflops", &p.indexer_mass_tflops},
              {"index_score_bwd_tflops", &p.index_score_bwd_tflops},
              {"latent_fwd_tflops", &p.latent_fwd_tflops},
              {"latent_bwd_tflops", &p.latent_bwd_tflops},
              {"latent_mass_tflops", &p.latent_mass_tflops},
              {"dense_indexer_loss_tflops", &p.dense_indexer_loss_tflops},
              {"optimizer_bytes_per_parameter", &p.optimizer_bytes_per_parameter},
              {"kernel_launch_s", &p.kernel_launch_s}},
             "", source, profile);
  for (const auto& row : calibration->sparse_attention()) {
    SparseAttentionRate& rate = p.sparse_attention[row.group()];
    SetFigures(row,
               {{"fwd_tflops", &rate.fwd_tflops},
                {"bwd_tflops", &rate.bwd_tflops},
                {"dedup", &rate.dedup}},
               absl::StrCat("sparse_attention[", row.group(), "]."), source, profile);
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::string> ReadCalibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read calibration file"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::string> CalibrationDevice(const std::string& path) {
  auto text = ReadCalibration(path);
  if (!text.ok()) return text.status();
  const auto calibration = ParseCalibration(*text);
  if (!calibration.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", calibration.status().message()));
  }
  return calibration->device();
}

absl::Status ApplyKeySharing(const std::string& text, DeviceProfile* profile) {
  std::map<int, double> measured;
  for (const absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const absl::string_view trimmed = absl::StripAsciiWhitespace(item);
    const std::vector<absl::string_view> parts = absl::StrSplit(trimmed, '=');
    int group = 0;
    double ratio = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &group) ||
        !absl::SimpleAtod(parts[1], &ratio)) {
      return absl::InvalidArgumentError(
          absl::StrCat("key sharing: '", trimmed, "' is not G=ratio (e.g. 4=1.5)"));
    }
    if (group <= 1 || !IsQueryGroup(group) || profile->sparse_attention.count(group) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key sharing: G ", group, " is not a query group above 1 with rates in profile ",
          profile->name, " (", kQueryGroupsText, ")"));
    }
    if (!(ratio >= 1 && ratio <= group)) {
      return absl::InvalidArgumentError(
          absl::StrCat("key sharing at G ", group, ": ", ratio, " is outside [1, ", group, "]"));
    }
    if (!measured.emplace(group, ratio).second) {
      return absl::InvalidArgumentError(absl::StrCat("key sharing: G ", group, " given twice"));
    }
  }
  if (measured.empty()) return absl::InvalidArgumentError("key sharing: no G=ratio given");
  std::vector<std::string> given;
  for (const auto& [group, ratio] : measured) {
    profile->sparse_attention[group].dedup = ratio;
    given.push_back(absl::StrCat(group, "=", ratio));
  }
  profile->sources["sparse_attention.dedup"] =
      absl::StrCat("measured key sharing: ", absl::StrJoin(given, ","),
                   measured.size() < std::size(kQueryGroups) - 1 ? " (other G as before)" : "");
  return absl::OkStatus();
}

absl::Status LoadCalibration(const std::string& path, DeviceProfile* profile) {
  auto text = ReadCalibration(path);
  if (!text.ok()) return text.status();
  auto status = ApplyCalibration(*text, profile);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace hyscale::server::planner
