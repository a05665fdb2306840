// What the Gloo and NCCL backends share: wrapping a c10d work item into our Work (deadline,
// error naming the collective and the rank, completion time), and the group's identity.
// Only the c10d API subset common to Debian's libtorch 1.13 (process groups derive from
// ProcessGroup) and PyTorch 2.x (they derive from Backend) is used: the concrete process group's
// allgather / alltoall_base / allreduce / barrier / _allgather_base / _reduce_scatter_base,
// Options::create(timeout), c10d::Work and its future; no version switch is needed.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/parallel/communicator.h"

namespace hyscale::parallel {

// How a backend's work is waited on: Gloo's wait(timeout) blocks on a condition variable and
// honours the deadline itself; NCCL's wait() only orders the current CUDA stream after the
// collective, so its completion is polled against the deadline first.
enum class WaitMode { kBlocking, kPoll };

class C10dCommunicator : public Communicator {
 public:
  C10dCommunicator(std::string backend, int rank, int world_size, std::chrono::milliseconds timeout)
      : backend_(std::move(backend)), rank_(rank), world_size_(world_size), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 protected:
  // `then` runs after the collective succeeded (e.g. a local reduction of received chunks).
  // `launch` calls into c10d; what it throws is kept and reported by wait().
  std::unique_ptr<Work> track(const char* collective, WaitMode mode,
                              const std::function<c10::intrusive_ptr<c10d::Work>()>& launch,
                              std::function<void()> then = nullptr) const;

 private:
  std::string backend_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
};

// The collectives whose c10d call is the same for every process group type.
template <typename Group>
class ProcessGroupCommunicator : public C10dCommunicator {
 public:
  ProcessGroupCommunicator(std::string backend, WaitMode mode, c10::intrusive_ptr<Group> group,
                           int rank, int world_size, std::chrono::milliseconds timeout)
      : C10dCommunicator(std::move(backend), rank, world_size, timeout),
        mode_(mode),
        group_(std::move(group)) {}

  std::unique_ptr<Work> all_reduce_async(const at::Tensor& t) override {
    return track("all_reduce", mode_, [this, t] {
      std::vector<at::Tensor> tensors{t};
      return group_->allreduce(tensors);
    });
  }

  std::unique_ptr<Work> barrier_async() override {
    return track("barrier", mode_, [this] { return group_->barrier(); });
  }

 protected:
  WaitMode mode_;
  c10::intrusive_ptr<Group> group_;
};

}  // namespace hyscale::parallel
