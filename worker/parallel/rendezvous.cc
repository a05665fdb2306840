#include "worker/parallel/rendezvous.h"

#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#ifdef HYSCALE_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace hyscale::parallel {
namespace {

absl::Status read_int(const char* name, bool required, int min, int* value) {
  const char* text = std::getenv(name);
  if (text == nullptr) {
    return required ? absl::InvalidArgumentError(absl::StrCat(name, " is not set"))
                    : absl::OkStatus();
  }
  if (!absl::SimpleAtoi(text, value) || *value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be an integer >= ", min, ", got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> make_store(const std::string& host, int port,
                                                           bool serve,
                                                           std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = serve;
  options.waitWorkers = false;  // the process group's own rendezvous waits for every rank
  options.timeout = timeout;
  try {
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(host, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(serve ? "serving" : "connecting to",
                                               " the rendezvous store at ", host, ":", port, ": ",
                                               e.what()));
  }
}

}  // namespace

absl::StatusOr<std::optional<RendezvousConfig>> RendezvousFromEnv() {
  RendezvousConfig config;
  if (auto status = read_int("HYSCALE_WORLD_SIZE", false, 1, &config.world_size); !status.ok()) {
    return status;
  }
  if (config.world_size == 1) return std::nullopt;
  int timeout_s =
      static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(config.timeout).count());
  int collective_timeout_s = static_cast<int>(
      std::chrono::duration_cast<std::chrono::seconds>(config.collective_timeout).count());
  for (const auto& status : {read_int("HYSCALE_RANK", true, 0, &config.rank),
                             read_int("HYSCALE_RENDEZVOUS_TIMEOUT_S", false, 1, &timeout_s),
                             read_int("HYSCALE_COMM_TIMEOUT_S", false, 1, &collective_timeout_s)}) {
    if (!status.ok()) return status;
  }
  if (config.rank >= config.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("HYSCALE_RANK (", config.rank,
                                                   ") must be below HYSCALE_WORLD_SIZE (",
                                                   config.world_size, ")"));
  }
  const char* address = std::getenv("HYSCALE_RENDEZVOUS");
  const std::string text = address == nullptr ? "" : address;
  const size_t colon = text.rfind(':');
  const int min_port = config.rank == 0 ? 0 : 1;  // only the server may ask for a free port
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &config.port) || config.port < min_port ||
      config.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HYSCALE_RENDEZVOUS must be host:port with a port in ", min_port,
                     "..65535, got '", text, "'"));
  }
  config.host = std::string(text.substr(0, colon));
  config.serve_store = config.rank == 0;
  config.timeout = std::chrono::seconds(timeout_s);
  config.collective_timeout = std::chrono::seconds(collective_timeout_s);
  return config;
}

c10::Device RankDevice(const std::optional<RendezvousConfig>& rendezvous, bool cuda) {
  if (!cuda) return c10::Device(c10::kCPU);
  const int rank = rendezvous ? rendezvous->rank : 0;
  const c10::Device device(
      c10::kCUDA,
      static_cast<c10::DeviceIndex>(rank % std::max<int64_t>(1, torch::cuda::device_count())));
#ifdef HYSCALE_HAVE_CUDA
  c10::cuda::set_device(device.index());
#endif
  return device;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RendezvousConfig& config,
                                                             int* served_port) {
  auto store = make_store(config.host, config.port, config.serve_store, config.timeout);
  if (store.ok() && served_port != nullptr) {
    *served_port = static_cast<c10d::TCPStore&>(**store).getPort();
  }
  return store;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ServeStore(const std::string& host,
                                                           std::chrono::milliseconds timeout,
                                                           int* port) {
  RendezvousConfig config;
  config.host = host;
  config.port = 0;
  config.timeout = timeout;
  return ConnectStore(config, port);
}

}  // namespace hyscale::parallel
