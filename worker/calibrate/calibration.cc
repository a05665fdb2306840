#include "worker/calibrate/calibration.h"

#include <absl/strings/str_cat.h>

#include "util/file.h"

namespace hyscale::calibrate {
namespace {

constexpr double kTera = 1e12, kGiga = 1e9;

nlohmann::json Timing(const Measurement& m, const char* work) {
  return {{"median_s", m.seconds}, {work, m.work}};
}

}  // namespace

nlohmann::json ToJson(const Calibration& c) {
  const Shapes& s = c.shapes;
  nlohmann::json doc;
  doc["device"] = c.device;
  doc["device_name"] = c.device_name;
  doc["source"] =
      absl::StrCat("hyscale-calibrate at ", c.commit.empty() ? "an unknown commit" : c.commit,
                   " on ", c.device_name, ", N = ", s.seq_len, " (selection ", s.selection_seq_len,
                   "), k = ", s.topk, ", ", c.date);
  if (!c.commit.empty()) doc["commit"] = c.commit;
  doc["date"] = c.date;
  doc["dense_tflops"] = c.dense.Rate() / kTera;
  doc["hbm_gbps"] = c.copy.Rate() / kGiga;
  doc["flash_topk_tflops"] = c.flash_topk.Rate() / kTera;
  doc["flash_topk_fp8_tflops"] = c.flash_topk_fp8.Rate() / kTera;
  doc["table_topk_tflops"] = c.table_topk.Rate() / kTera;
  doc["gather_fwd_tflops"] = c.gather.fwd.Rate() / kTera;
  doc["gather_bwd_tflops"] = c.gather.bwd.Rate() / kTera;
  doc["indexer_mass_tflops"] = c.indexer_loss.mass.Rate() / kTera;
  doc["index_score_bwd_tflops"] = c.indexer_loss.score_bwd.Rate() / kTera;
  doc["kernel_launch_s"] = c.kernel_launch_s;
  nlohmann::json sparse = nlohmann::json::array();
  nlohmann::json sparse_timings = nlohmann::json::array();
  for (const auto& m : c.sparse_attention) {
    sparse.push_back({{"group", m.group},
                      {"fwd_tflops", m.fwd.Rate() / kTera},
                      {"bwd_tflops", m.bwd.Rate() / kTera},
                      {"dedup", m.dedup}});
    sparse_timings.push_back(
        {{"group", m.group}, {"fwd", Timing(m.fwd, "flops")}, {"bwd", Timing(m.bwd, "flops")}});
  }
  doc["sparse_attention"] = sparse;
  if (c.latent) {
    doc["latent_fwd_tflops"] = c.latent->fwd.Rate() / kTera;
    doc["latent_bwd_tflops"] = c.latent->bwd.Rate() / kTera;
  }
  doc["shapes"] = ToJson(s);
  doc["measurements"] = {
      {"dense", Timing(c.dense, "flops")},
      {"copy", Timing(c.copy, "bytes")},
      {"flash_topk", Timing(c.flash_topk, "flops")},
      {"flash_topk_fp8", Timing(c.flash_topk_fp8, "flops")},
      {"table_topk", Timing(c.table_topk, "flops")},
      {"gather_fwd", Timing(c.gather.fwd, "flops")},
      {"gather_bwd", Timing(c.gather.bwd, "flops")},
      {"indexer_mass", Timing(c.indexer_loss.mass, "flops")},
      {"index_score_bwd", Timing(c.indexer_loss.score_bwd, "flops")},
      {"sparse_attention", sparse_timings},
  };
  if (c.latent) {
    doc["measurements"]["latent_fwd"] = Timing(c.latent->fwd, "flops");
    doc["measurements"]["latent_bwd"] = Timing(c.latent->bwd, "flops");
  }
  doc["notes"] = c.notes;
  return doc;
}

absl::Status WriteJson(const std::string& path, const nlohmann::json& doc) {
  return util::WriteFileAtomically(path, doc.dump(2) + "\n");
}

}  // namespace hyscale::calibrate
