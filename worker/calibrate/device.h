// The device hyscale-calibrate measures: CUDA when the kernels were built with CUDA and a GPU is
// present, else the CPU; and how to wait for it.
#pragma once

#include <absl/status/statusor.h>
#include <c10/core/Device.h>

#include <string>

namespace hyscale::calibrate {

// `flag`: "auto", "cpu" or "cuda"; an error names --device and says why it cannot be used.
absl::StatusOr<c10::Device> ResolveDevice(const std::string& flag);

// "NVIDIA H200", or "cpu".
std::string DeviceName(const c10::Device& device);

// The built-in profile a device's figures belong to (profile.h): "h200", "h800", "h20" or "cpu";
// other GPUs by their lower-cased name ("nvidia-a100-sxm4-80gb").
std::string ProfileName(const std::string& device_name);

// Waits for the device's queued work.
void Synchronize(const c10::Device& device);

}  // namespace hyscale::calibrate
