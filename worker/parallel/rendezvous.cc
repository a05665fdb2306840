#include "worker/parallel/rendezvous.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

absl::StatusOr<RendezvousConfig> RendezvousFromEnv() {
  RendezvousConfig config;
  if (const char* addr = std::getenv("MASTER_ADDR")) config.host = addr;
  int timeout_s =
      static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(config.timeout).count());
  for (const auto& status :
       {read_int("MASTER_PORT", false, 1, &config.port), read_int("RANK", true, 0, &config.rank),
        read_int("WORLD_SIZE", true, 1, &config.world_size),
        read_int("HYSCALE_COMM_TIMEOUT_S", false, 1, &timeout_s)}) {
    if (!status.ok()) return status;
  }
  if (config.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT must be <= 65535, got ", config.port));
  }
  if (config.rank >= config.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RANK (", config.rank, ") must be below WORLD_SIZE (", config.world_size, ")"));
  }
  config.serve_store = config.rank == 0;
  config.timeout = std::chrono::seconds(timeout_s);
  return config;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RendezvousConfig& config) {
  return make_store(config.host, config.port, config.serve_store, config.timeout);
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ServeStore(const std::string& host,
                                                           std::chrono::milliseconds timeout,
                                                           int* port) {
  auto store = make_store(host, 0, true, timeout);
  if (!store.ok()) return store.status();
  *port = static_cast<c10d::TCPStore&>(**store).getPort();
  return store;
}

}  // namespace hyscale::parallel
