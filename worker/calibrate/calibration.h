// A calibration file (planner/profile.h, ApplyCalibration): the measured figures, and how
// they were measured (device, commit, date, shapes, raw timings, notes).
#pragma once

#include <absl/status/status.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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
  std::optional<SparseAttentionMeasurement> latent;  // measured when d_v <= d_qk
  GatherMeasurement gather;
  IndexerLossMeasurement indexer_loss;
  double kernel_launch_s = 0;
  std::vector<std::string> notes;
};

nlohmann::json ToJson(const Calibration& calibration);

// Writes `doc` to `path` through a temporary file, so a reader never sees half a file.
absl::Status WriteJson(const std::string& path, const nlohmann::json& doc);

}  // namespace hyscale::calibrate
