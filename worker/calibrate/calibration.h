// A calibration file (hyscale.v1.Calibration, read by planner/profile.h's ApplyCalibration): the
// measured figures, and how they were measured (device, commit, date, shapes, raw timings, notes).
#pragma once

#include <absl/status/status.h>

#include <optional>
#include <string>
#include <vector>

#include "hyscale/v1/calibration.pb.h"
#include "worker/calibrate/benchmarks.h"
#include "worker/calibrate/shapes.h"

namespace hyscale::calibrate {

struct Calibration {
  std::string device;       // the profile the figures belong to: "h200", "cpu", ...
  std::string device_name;  // "NVIDIA H200"
  std::string commit;       // of the source the tool was built from; empty when unknown
  std::string date;         // UTC, ISO 8601
  Shapes shapes;
  Measurement dense, copy, flash_topk, flash_topk_fp8, table_topk;
  std::vector<SparseAttentionMeasurement> sparse_attention;
  std::optional<LatentMeasurement> latent;  // measured when d_v <= d_qk
  GatherMeasurement gather;
  IndexerLossMeasurement indexer_loss;
  Measurement dense_indexer_loss;
  Measurement optimizer;  // work: the parameters it steps
  double kernel_launch_s = 0;
  std::vector<std::string> notes;
};

// The optimizer's figure: the bytes a parameter a copy moves in its step's time (the planner
// charges the step as bytes at hbm_gbps).
double OptimizerBytesPerParameter(const Calibration& calibration);

// The file's content: rates from the measurements, and the measurements themselves.
v1::Calibration ToProto(const Calibration& calibration);

// Writes `calibration` to `path` as indented protobuf JSON through a temporary file, so a reader
// never sees half a file.
absl::Status WriteCalibration(const std::string& path, const v1::Calibration& calibration);

}  // namespace hyscale::calibrate
