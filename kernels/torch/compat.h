// The differences between the libtorch versions HyScale builds against (Debian's 1.13 CPU build
// and PyTorch 2.11's CUDA build), in one place.
#pragma once

#include <torch/optim/optimizer.h>

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

}  // namespace hyscale::compat
