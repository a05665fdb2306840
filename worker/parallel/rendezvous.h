// Rendezvous of a context-parallel group: the ranks meet through a c10d TCPStore (a small
// key-value server) that rank 0 hosts. Every rank reads its place from the environment:
//   HYSCALE_WORLD_SIZE  ranks in the group (unset or 1: no group)
//   HYSCALE_RANK        this rank, 0 .. world - 1
//   HYSCALE_RENDEZVOUS  "host:port" of rank 0's store; rank 0 may give port 0 (a free port the
//                       kernel picks) and then publishes the real one (the coordinator forwards
//                       it to the other ranks; standalone runs give a fixed port to every rank)
//   HYSCALE_RENDEZVOUS_TIMEOUT_S  deadline of meeting the other ranks (default 300)
//   HYSCALE_COMM_TIMEOUT_S        deadline of every collective after that (default 300)
#pragma once

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace hyscale::parallel {

struct RendezvousConfig {
  std::string host = "127.0.0.1";  // where the store is served
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  bool serve_store = true;  // this process hosts the store (rank 0 in a standalone run)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // of meeting the other ranks
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(5)};
};

// The variables above; nullopt when this process runs alone. Rank 0 serves the store. Errors
// name the variable.
absl::StatusOr<std::optional<RendezvousConfig>> RendezvousFromEnv();

// This process's device: with `cuda`, the GPU its rank (0 when it runs alone) picks, rank mod the
// visible GPUs (a standalone run's ranks share them; the agent shows each rank only its own), made
// the current device for NCCL and the kernels; else the CPU.
c10::Device RankDevice(const std::optional<RendezvousConfig>& rendezvous, bool cuda);

// Connects to (or serves) the store; fails after config.timeout if the server never answers.
// A server's port (the kernel's pick for port 0) goes to *served_port when given.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RendezvousConfig& config,
                                                             int* served_port = nullptr);

// A store served by this process on a free port of `host` (port 0: the kernel picks), for
// tests and launchers that start the ranks themselves. The port is in *port.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ServeStore(const std::string& host,
                                                           std::chrono::milliseconds timeout,
                                                           int* port);

}  // namespace hyscale::parallel
