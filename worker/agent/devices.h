// The devices a worker offers the coordinator: its GPUs, or one CPU device when it has none.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hyscale/v1/service.pb.h"

namespace hyscale::agent {

// Parses nvidia-smi's `--query-gpu=name,memory.total --format=csv,noheader,nounits` output (one
// GPU per line, memory in MiB) into devices, GPUs of one name and memory grouped into one entry.
absl::StatusOr<std::vector<v1::Device>> ParseNvidiaSmi(const std::string& csv);

// Parses a --devices override: comma-separated "KIND:COUNT[:MEMORY]" with KIND cpu or gpu and
// MEMORY per device like 141GB, 512MiB or a byte count, e.g. "cpu:2" or "gpu:8:141GB". A missing
// memory is the machine's memory (cpu) or 0 (gpu).
absl::StatusOr<std::vector<v1::Device>> ParseDeviceOverride(const std::string& text);

// The machine's devices: GPUs through nvidia-smi when it is on PATH and lists any, otherwise one
// `cpu` device with the machine's physical memory.
std::vector<v1::Device> DetectDevices();

// Total slots of `kind` among `devices`.
int32_t SlotCount(const std::vector<v1::Device>& devices, v1::DeviceKind kind);

// "2x cpu (7.6 GiB), 8x NVIDIA H200 (140.0 GiB)": for log lines.
std::string DescribeDevices(const std::vector<v1::Device>& devices);

}  // namespace hyscale::agent
