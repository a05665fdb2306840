// The NCCL backend (CUDA tensors): c10d's ProcessGroupNCCL. Built only with CUDA and NCCL
// (HYSCALE_HAVE_NCCL); the CPU build never includes it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace hyscale::parallel {

struct NcclOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string group = "cp";  // as GlooOptions::group
};

// The caller selects this rank's CUDA device first; NCCL communicators are created lazily, on
// the first collective, and fail it after options.timeout when a peer never shows up.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const NcclOptions& options);

}  // namespace hyscale::parallel
