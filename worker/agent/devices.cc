#include "worker/agent/devices.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "util/subprocess.h"

namespace hyscale::agent {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t MachineMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

// Bytes from "141GB", "512MiB", "64G", "1024": decimal and binary units both mean powers of 1024,
// as device memory is quoted that way in practice.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  struct Unit {
    const char* suffix;
    int64_t scale;
  };
  static constexpr Unit kUnits[] = {{"tib", int64_t{1} << 40},
                                    {"tb", int64_t{1} << 40},
                                    {"t", int64_t{1} << 40},
                                    {"gib", int64_t{1} << 30},
                                    {"gb", int64_t{1} << 30},
                                    {"g", int64_t{1} << 30},
                                    {"mib", kMiB},
                                    {"mb", kMiB},
                                    {"m", kMiB},
                                    {"b", 1}};
  int64_t scale = 1;
  absl::string_view number = lower;
  for (const Unit& unit : kUnits) {
    if (absl::ConsumeSuffix(&number, unit.suffix)) {
      scale = unit.scale;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("devices: bad memory size '", text, "'"));
  }
  return static_cast<int64_t>(value * static_cast<double>(scale));
}

std::string FormatGiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
}

// What nvidia-smi (from PATH) prints on stdout for `args`; empty when it is not there or fails.
std::string NvidiaSmi(std::vector<std::string> args) {
  const std::string program = util::FindExecutable("nvidia-smi");
  if (program.empty()) return "";
  args.insert(args.begin(), program);
  util::Command command(std::move(args));
  command.stderr_to = util::Redirect::Null();
  auto run = util::RunAndCapture(std::move(command));
  return run.ok() && run->exit.Succeeded() ? run->output : "";
}

}  // namespace

absl::StatusOr<std::vector<v1::Device>> ParseNvidiaSmi(const std::string& csv) {
  std::vector<v1::Device> devices;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("nvidia-smi: unexpected line '", line, "'"));
    }
    const std::string name(absl::StripAsciiWhitespace(fields[0]));
    int64_t mib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[1]), &mib)) {
      return absl::InvalidArgumentError(absl::StrCat("nvidia-smi: bad memory in '", line, "'"));
    }
    if (!devices.empty() && devices.back().name() == name &&
        devices.back().memory_bytes() == mib * kMiB) {
      devices.back().set_count(devices.back().count() + 1);
      continue;
    }
    v1::Device device;
    device.set_name(name);
    device.set_kind(v1::DEVICE_KIND_GPU);
    device.set_memory_bytes(mib * kMiB);
    device.set_count(1);
    devices.push_back(device);
  }
  return devices;
}

absl::StatusOr<std::vector<v1::Device>> ParseDeviceOverride(const std::string& text) {
  std::vector<v1::Device> devices;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(absl::StripAsciiWhitespace(item), ':');
    if (parts.size() < 2 || parts.size() > 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "devices: '", item, "' is not KIND:COUNT[:MEMORY] (e.g. cpu:2, gpu:8:141GB)"));
    }
    const std::string kind = absl::AsciiStrToLower(parts[0]);
    v1::Device device;
    if (kind == "cpu") {
      device.set_kind(v1::DEVICE_KIND_CPU);
      device.set_name("cpu");
      device.set_memory_bytes(MachineMemoryBytes());
    } else if (kind == "gpu") {
      device.set_kind(v1::DEVICE_KIND_GPU);
      device.set_name("gpu");
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("devices: kind must be cpu or gpu (got '", parts[0], "')"));
    }
    int32_t count = 0;
    if (!absl::SimpleAtoi(parts[1], &count) || count <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices: count must be a positive integer (got '", parts[1], "')"));
    }
    device.set_count(count);
    if (parts.size() == 3) {
      auto bytes = ParseBytes(parts[2]);
      if (!bytes.ok()) return bytes.status();
      device.set_memory_bytes(*bytes);
    }
    devices.push_back(device);
  }
  if (devices.empty()) return absl::InvalidArgumentError("devices: empty override");
  return devices;
}

std::vector<v1::Device> DetectDevices() {
  const std::string csv =
      NvidiaSmi({"--query-gpu=name,memory.total", "--format=csv,noheader,nounits"});
  if (auto gpus = ParseNvidiaSmi(csv); gpus.ok() && !gpus->empty()) return *std::move(gpus);
  v1::Device cpu;
  cpu.set_name("cpu");
  cpu.set_kind(v1::DEVICE_KIND_CPU);
  cpu.set_memory_bytes(MachineMemoryBytes());
  cpu.set_count(1);
  return {cpu};
}

int32_t SlotCount(const std::vector<v1::Device>& devices, v1::DeviceKind kind) {
  int32_t count = 0;
  for (const auto& device : devices) {
    if (device.kind() == kind) count += device.count();
  }
  return count;
}

std::string DescribeDevices(const std::vector<v1::Device>& devices) {
  std::string text;
  for (const auto& device : devices) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", device.count(), "x ", device.name(), " (",
                    FormatGiB(device.memory_bytes()), ")");
  }
  return text;
}

}  // namespace hyscale::agent
