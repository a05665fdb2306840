// Rendezvous of a standalone run: the ranks meet through a c10d TCPStore (a small key-value
// server) that rank 0 hosts, at an address given by flags or MASTER_ADDR / MASTER_PORT-style
// environment variables. Jobs run by the coordinator get the same address with their spec.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace hyscale::parallel {

struct RendezvousConfig {
  std::string host = "127.0.0.1";  // where the store is served
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  bool serve_store = true;  // this process hosts the store (rank 0 in a standalone run)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and HYSCALE_COMM_TIMEOUT_S (seconds,
// optional); rank 0 serves the store. Errors name the variable.
absl::StatusOr<RendezvousConfig> RendezvousFromEnv();

// Connects to (or serves) the store; fails after config.timeout if the server never answers.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RendezvousConfig& config);

// A store served by this process on a free port of `host` (port 0: the kernel picks), for
// tests and launchers that start the ranks themselves. The port is in *port.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ServeStore(const std::string& host,
                                                           std::chrono::milliseconds timeout,
                                                           int* port);

}  // namespace hyscale::parallel
