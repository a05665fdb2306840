// Collectives between the ranks of a context-parallel group (DESIGN.md section 5), behind one
// interface with two backends: Gloo on CPU (gloo_communicator.h) and NCCL on GPU
// (nccl_communicator.h). Every wait has a deadline: a dead or stuck rank makes the others fail
// with an error naming the collective and the rank, never hang.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace hyscale::parallel {

// One collective in flight. Tensors passed to it must stay alive and untouched until wait().
class Work {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Work() = default;

  // Blocks until the collective finished, failed, or `timeout` passed (DeadlineExceeded).
  virtual absl::Status wait(std::chrono::milliseconds timeout) = 0;

  // When it was launched, and when it finished (known once it has, if the backend reports it):
  // the difference to the moment a caller started waiting is the exposed communication time.
  virtual Clock::time_point launched_at() const = 0;
  virtual std::optional<Clock::time_point> finished_at() const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The deadline of the blocking forms below and of the backend's own operations.
  virtual std::chrono::milliseconds timeout() const = 0;

  // out [world * n, ...] = every rank's `in` [n, ...] concatenated along dim 0, in rank order.
  virtual std::unique_ptr<Work> all_gather_async(const at::Tensor& out, const at::Tensor& in) = 0;
  // out [n, ...] = sum over ranks of their in[rank * n, (rank + 1) * n).
  virtual std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& out,
                                                     const at::Tensor& in) = 0;
  // t = sum over ranks of t, in place.
  virtual std::unique_ptr<Work> all_reduce_async(const at::Tensor& t) = 0;
  virtual std::unique_ptr<Work> barrier_async() = 0;

  // Blocking forms: launch, then wait with timeout().
  absl::Status all_gather(const at::Tensor& out, const at::Tensor& in) {
    return all_gather_async(out, in)->wait(timeout());
  }
  absl::Status reduce_scatter(const at::Tensor& out, const at::Tensor& in) {
    return reduce_scatter_async(out, in)->wait(timeout());
  }
  absl::Status all_reduce(const at::Tensor& t) { return all_reduce_async(t)->wait(timeout()); }
  absl::Status barrier() { return barrier_async()->wait(timeout()); }
};

}  // namespace hyscale::parallel
