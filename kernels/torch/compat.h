// The differences between the libtorch versions HyScale builds against (Debian's 1.13 CPU build
// and PyTorch 2.11's CUDA build), in one place.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace hyscale::compat {

// torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl: as a string in 1.13,
// as a pointer in 2.x.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;  // what 1.13's c10::guts::to_string(TensorImpl*) produces
    address << param.unsafeGetTensorImpl();
    return address.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// bf16 autocast on CUDA for the guard's lifetime, as torch.autocast("cuda", torch.bfloat16)
// does: matmuls in bf16, reductions in fp32. Autocast state is per thread, so recomputation in
// backward (autograd's device thread) opens its own guard. Leaving the outermost one drops the
// cache of bf16 weight copies, which the optimizer step makes stale.
class CudaBf16Autocast {
 public:
  explicit CudaBf16Autocast(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR >= 2
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
#else
    was_enabled_ = at::autocast::is_enabled();
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
#endif
    at::autocast::increment_nesting();
  }
  ~CudaBf16Autocast() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
#else
    at::autocast::set_enabled(was_enabled_);
#endif
  }
  CudaBf16Autocast(const CudaBf16Autocast&) = delete;
  CudaBf16Autocast& operator=(const CudaBf16Autocast&) = delete;

 private:
  bool enabled_;
  bool was_enabled_ = false;
};

// ATen's AdamW over a list of tensors in one kernel (its multi-tensor apply on CUDA), the
// gradients divided by grad_scale first when given: libtorch 2.x. 1.13 has only Adam's (L2 decay,
// not decoupled), so there kHasFusedAdamW is false and the call throws.
constexpr bool kHasFusedAdamW = TORCH_VERSION_MAJOR >= 2;
inline void fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1,
                        double beta2, double weight_decay, double eps,
                        const c10::optional<at::Tensor>& grad_scale) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1,
                    beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale,
                    /*found_inf=*/c10::nullopt);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1,
      (void)beta2, (void)weight_decay, (void)eps, (void)grad_scale;
  TORCH_CHECK(false, "fused AdamW needs libtorch 2.x");
#endif
}

}  // namespace hyscale::compat
