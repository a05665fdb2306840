// The trainer's optimizer step as a calibration figure: its bytes a trained parameter at the
// device's copy bandwidth (the planner charges trained parameters x bytes / hbm_gbps).
#pragma once

#include <c10/core/Device.h>

#include "worker/calibrate/benchmarks.h"
#include "worker/calibrate/shapes.h"

namespace hyscale::calibrate {

// worker/trainer/optimizer.h's adamw_step with gradient clipping over shapes.optimizer_parameters
// fp32 parameters on `device` (matrices with weight decay and a few vectors without, as the
// trainer groups a model's): the median step's seconds; work = the parameters.
Measurement OptimizerStep(c10::Device device, const Shapes& shapes);

}  // namespace hyscale::calibrate
