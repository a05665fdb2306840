#include "worker/parallel/nccl_communicator.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/parallel/c10d_communicator.h"

namespace hyscale::parallel {
namespace {

// NCCL work completes on the GPU: wait() polls its completion against the deadline, then
// orders the caller's current stream after it (WaitMode::kPoll).
class NcclCommunicator : public ProcessGroupCommunicator<c10d::ProcessGroupNCCL> {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::ProcessGroupNCCL> group, int rank, int world_size,
                   std::chrono::milliseconds timeout)
      : ProcessGroupCommunicator("nccl", WaitMode::kPoll, std::move(group), rank, world_size,
                                 timeout) {}

  std::unique_ptr<Work> all_gather_async(const at::Tensor& out, const at::Tensor& in) override {
    // Captured tensors are const copies; c10d takes non-const references.
    return track("all_gather", WaitMode::kPoll, [this, out, in] {
      auto output = out;
      auto input = in.contiguous();
      return group_->_allgather_base(output, input);
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& out, const at::Tensor& in) override {
    return track("reduce_scatter", WaitMode::kPoll, [this, out, in] {
      auto output = out;
      auto input = in.contiguous();
      return group_->_reduce_scatter_base(output, input);
    });
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const NcclOptions& options) {
  try {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("hyscale/", options.group), store);
    auto group =
        c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, world_size, nccl_options);
    return std::unique_ptr<Communicator>(
        std::make_unique<NcclCommunicator>(std::move(group), rank, world_size, options.timeout));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("nccl group '", options.group, "': rank ", rank,
                                               " of ", world_size, ": ", e.what()));
  }
}

}  // namespace hyscale::parallel
