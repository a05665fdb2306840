// The Gloo backend (CPU tensors): c10d's ProcessGroupGloo over TCP.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace hyscale::parallel {

struct GlooOptions {
  // This process's address as its peers reach it ("127.0.0.1" when every rank is on one
  // machine); empty: the address this machine's hostname resolves to.
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Groups sharing one store are told apart by name (e.g. the attention and indexer CP groups).
  std::string group = "cp";
};

// Joins the group of `world_size` ranks; returns once every rank joined, or an error after
// options.timeout.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const GlooOptions& options);

}  // namespace hyscale::parallel
