#include "worker/calibrate/device.h"

#include <ATen/Context.h>
#include <absl/strings/ascii.h>
#include <absl/strings/str_split.h>

#include <vector>

#ifdef HYSCALE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace hyscale::calibrate {

absl::StatusOr<c10::Device> ResolveDevice(const std::string& flag) {
#ifdef HYSCALE_HAVE_CUDA
  const bool built_with_cuda = true;
#else
  const bool built_with_cuda = false;
#endif
  const bool cuda = built_with_cuda && at::hasCUDA();
  if (flag == "cpu") return c10::Device(c10::kCPU);
  if (flag == "auto") return cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (flag != "cuda") {
    return absl::InvalidArgumentError("--device: must be auto, cpu or cuda, got '" + flag + "'");
  }
  if (!built_with_cuda) {
    return absl::InvalidArgumentError(
        "--device cuda: this build has no CUDA kernels (needs nvcc and a CUDA libtorch)");
  }
  if (!cuda) return absl::InvalidArgumentError("--device cuda: no CUDA device on this machine");
  return c10::Device(c10::kCUDA, 0);
}

std::string DeviceName(const c10::Device& device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return device.str();
}

std::string ProfileName(const std::string& device_name) {
  const std::string lower = absl::AsciiStrToLower(device_name);
  const std::vector<std::string> words = absl::StrSplit(lower, absl::ByAnyChar(" -_"));
  for (const char* known : {"h200", "h800", "h20", "cpu"}) {
    for (const auto& word : words) {
      if (word == known) return known;
    }
  }
  std::string name;
  for (const auto& word : words) {
    if (word.empty()) continue;
    if (!name.empty()) name += '-';
    name += word;
  }
  return name;
}

void Synchronize([[maybe_unused]] const c10::Device& device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

}  // namespace hyscale::calibrate
