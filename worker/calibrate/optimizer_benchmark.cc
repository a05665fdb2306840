#include "worker/calibrate/optimizer_benchmark.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <vector>

#include "worker/calibrate/timer.h"
#include "worker/trainer/optimizer.h"

namespace hyscale::calibrate {
namespace {

constexpr int64_t kWidth = 2048;   // a row of the reference model's matrices
constexpr int kMatrices = 16;      // enough tensors that a step is many kernels, as a model's is
constexpr double kGradClip = 1.0;  // the trainer's clipping runs in every measured step

// Parameters that only the optimizer touches: matrices and one vector a matrix.
class Parameters : public torch::nn::Module {
 public:
  Parameters(int64_t total, c10::Device device) {
    const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
    const int64_t rows = std::max<int64_t>(1, (total / kMatrices - kWidth) / kWidth);
    for (int i = 0; i < kMatrices; ++i) {
      const std::string name = std::to_string(i);
      register_parameter("w" + name, torch::randn({rows, kWidth}, options) * 0.02);
      register_parameter("g" + name, torch::ones({kWidth}, options));
    }
  }
};

}  // namespace

Measurement OptimizerStep(c10::Device device, const Shapes& shapes) {
  Parameters model(shapes.optimizer_parameters, device);
  v1::OptimizerSpec spec;
  spec.set_weight_decay(0.1F);
  spec.set_beta1(0.9F);
  spec.set_beta2(0.95F);
  spec.set_eps(1e-8F);
  const auto optimizer = trainer::make_adamw(model, spec);
  const std::vector<torch::Tensor> parameters = model.parameters();
  int64_t count = 0;
  for (const auto& p : parameters) {
    p.mutable_grad() = torch::randn_like(p) * 1e-3;
    count += p.numel();
  }
  const Timer timer(device, shapes.warmup, shapes.runs);
  const double seconds =
      timer.Median([&] { trainer::adamw_step(*optimizer, parameters, kGradClip); });
  return {seconds, static_cast<double>(count)};
}

}  // namespace hyscale::calibrate
