#include "worker/parallel/gloo_communicator.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/parallel/c10d_communicator.h"

namespace hyscale::parallel {
namespace {

class GlooCommunicator : public ProcessGroupCommunicator<c10d::ProcessGroupGloo> {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank, int world_size,
                   std::chrono::milliseconds timeout)
      : ProcessGroupCommunicator("gloo", WaitMode::kBlocking, std::move(group), rank, world_size,
                                 timeout) {}

  std::unique_ptr<Work> all_gather_async(const at::Tensor& out, const at::Tensor& in) override {
    // The list form (Gloo in 1.13 has no _allgather_base): one view of `out` per rank.
    return track("all_gather", WaitMode::kBlocking, [this, out, in] {
      std::vector<std::vector<at::Tensor>> outputs{out.chunk(world_size())};
      std::vector<at::Tensor> inputs{in};
      return group_->allgather(outputs, inputs);
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& out, const at::Tensor& in) override {
    // Gloo in 1.13 has no reduce-scatter: an all-to-all moves each rank's chunk r to rank r
    // (the same bytes a ring reduce-scatter moves), then the chunks are summed in rank order.
    auto received = at::empty(in.sizes(), in.options());
    return track(
        "reduce_scatter", WaitMode::kBlocking,
        [this, received, in]() mutable {
          auto input = in.contiguous();
          std::vector<int64_t> equal_split;
          return group_->alltoall_base(received, input, equal_split, equal_split);
        },
        [received, out, world = world_size()] {
          std::vector<int64_t> chunks{world, received.size(0) / world};
          for (int64_t d = 1; d < received.dim(); ++d) chunks.push_back(received.size(d));
          out.copy_(received.view(chunks).sum(0));
        });
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const GlooOptions& options) {
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(
        options.hostname.empty()
            ? c10d::ProcessGroupGloo::createDefaultDevice()
            : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("hyscale/", options.group), store);
    auto group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world_size, gloo_options);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(std::move(group), rank, world_size, options.timeout));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo group '", options.group, "': rank ", rank,
                                               " of ", world_size, " could not join within ",
                                               options.timeout.count(), " ms: ", e.what()));
  }
}

}  // namespace hyscale::parallel
