#include "worker/calibrate/calibration.h"

#include <absl/strings/str_cat.h>

#include "util/file.h"

#include "proto/proto_json.h"

namespace hyscale::calibrate {
namespace {

constexpr double kTera = 1e12, kGiga = 1e9;

v1::Calibration::Timing Flops(const Measurement& m) {
  v1::Calibration::Timing timing;
  timing.set_median_s(m.seconds);
  timing.set_flops(m.work);
  return timing;
}

v1::Calibration::Timing Bytes(const Measurement& m) {
  v1::Calibration::Timing timing;
  timing.set_median_s(m.seconds);
  timing.set_bytes(m.work);
  return timing;
}

}  // namespace

double OptimizerBytesPerParameter(const Calibration& c) {
  return c.optimizer.seconds * c.copy.Rate() / c.optimizer.work;
}

v1::Calibration ToProto(const Calibration& c) {
  const Shapes& s = c.shapes;
  v1::Calibration doc;
  doc.set_device(c.device);
  doc.set_device_name(c.device_name);
  doc.set_source(absl::StrCat("hyscale-calibrate at ",
                              c.commit.empty() ? "an unknown commit" : c.commit, " on ",
                              c.device_name, ", N = ", s.seq_len, " (selection ",
                              s.selection_seq_len, "), k = ", s.topk, ", ", c.date));
  doc.set_commit(c.commit);
  doc.set_date(c.date);
  doc.set_dense_tflops(c.dense.Rate() / kTera);
  doc.set_hbm_gbps(c.copy.Rate() / kGiga);
  doc.set_flash_topk_tflops(c.flash_topk.Rate() / kTera);
  doc.set_flash_topk_fp8_tflops(c.flash_topk_fp8.Rate() / kTera);
  doc.set_table_topk_tflops(c.table_topk.Rate() / kTera);
  doc.set_gather_fwd_tflops(c.gather.fwd.Rate() / kTera);
  doc.set_gather_bwd_tflops(c.gather.bwd.Rate() / kTera);
  doc.set_indexer_mass_tflops(c.indexer_loss.mass.Rate() / kTera);
  doc.set_index_score_bwd_tflops(c.indexer_loss.score_bwd.Rate() / kTera);
  doc.set_kernel_launch_s(c.kernel_launch_s);
  v1::Calibration::Measurements& timings = *doc.mutable_measurements();
  for (const auto& m : c.sparse_attention) {
    auto* rate = doc.add_sparse_attention();
    rate->set_group(m.group);
    rate->set_fwd_tflops(m.fwd.Rate() / kTera);
    rate->set_bwd_tflops(m.bwd.Rate() / kTera);
    rate->set_dedup(m.dedup);
    auto* timing = timings.add_sparse_attention();
    timing->set_group(m.group);
    *timing->mutable_fwd() = Flops(m.fwd);
    *timing->mutable_bwd() = Flops(m.bwd);
  }
  if (c.latent) {
    doc.set_latent_fwd_tflops(c.latent->fwd.Rate() / kTera);
    doc.set_latent_bwd_tflops(c.latent->bwd.Rate() / kTera);
    doc.set_latent_mass_tflops(c.latent->target.Rate() / kTera);
    *timings.mutable_latent_fwd() = Flops(c.latent->fwd);
    *timings.mutable_latent_bwd() = Flops(c.latent->bwd);
    *timings.mutable_latent_mass() = Flops(c.latent->target);
  }
  doc.set_dense_indexer_loss_tflops(c.dense_indexer_loss.Rate() / kTera);
  *timings.mutable_dense_indexer_loss() = Flops(c.dense_indexer_loss);
  doc.set_optimizer_bytes_per_parameter(OptimizerBytesPerParameter(c));
  timings.mutable_optimizer()->set_median_s(c.optimizer.seconds);
  timings.mutable_optimizer()->set_parameters(c.optimizer.work);
  *doc.mutable_shapes() = ToProto(s);
  *timings.mutable_dense() = Flops(c.dense);
  *timings.mutable_copy() = Bytes(c.copy);
  *timings.mutable_flash_topk() = Flops(c.flash_topk);
  *timings.mutable_flash_topk_fp8() = Flops(c.flash_topk_fp8);
  *timings.mutable_table_topk() = Flops(c.table_topk);
  *timings.mutable_gather_fwd() = Flops(c.gather.fwd);
  *timings.mutable_gather_bwd() = Flops(c.gather.bwd);
  *timings.mutable_indexer_mass() = Flops(c.indexer_loss.mass);
  *timings.mutable_index_score_bwd() = Flops(c.indexer_loss.score_bwd);
  for (const auto& note : c.notes) doc.add_notes(note);
  return doc;
}

absl::Status WriteCalibration(const std::string& path, const v1::Calibration& calibration) {
  const auto json = PrintProtoJson(calibration, JsonLayout::kIndented);
  if (!json.ok()) return json.status();
  return util::WriteFileAtomically(path, *json + "\n");
}

}  // namespace hyscale::calibrate
