// The context-parallel key exchange of a DSA layer (DESIGN.md section 5): every rank's key
// side (MQA keys and values, indexer keys) is all-gathered while the query side is projected;
// in backward the key-side gradients are reduce-scattered back to their owners.
#pragma once

#include <torch/types.h>

#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/model.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/layout.h"

namespace hyscale::parallel {

// Communication seconds since the last take(): overlapped with computation, and exposed
// (waited for: the whole backward reduce-scatter, and what of the all-gather the query side
// did not hide).
struct CommTimes {
  double overlapped_s = 0;
  double exposed_s = 0;
};

class ContextParallelExchange : public trainer::KeyExchange {
 public:
  // seq_len: the global sequence length N; this rank holds the positions `layout` gives it.
  static absl::StatusOr<std::shared_ptr<ContextParallelExchange>> Create(
      std::shared_ptr<Communicator> comm, v1::CpLayout layout, int64_t seq_len);

  ~ContextParallelExchange() override;

  torch::Tensor positions() const override { return positions_; }
  void start(const torch::Tensor& local) override;
  torch::Tensor finish() override;

  CommTimes take_times();

  // Shared with the backward function, which outlives a forward call.
  struct State;

 private:
  ContextParallelExchange(c10::intrusive_ptr<State> state, torch::Tensor positions);

  c10::intrusive_ptr<State> state_;
  torch::Tensor positions_;
  torch::Tensor local_, gathered_;
  std::unique_ptr<Work> work_;
};

// The mean of a per-rank mean over all ranks (equal shard sizes), detached: the value of a loss
// (e.g. the indexer KL) across shards. Each rank backpropagates its local mean / world size.
absl::StatusOr<torch::Tensor> MeanAcrossRanks(Communicator& comm, const torch::Tensor& local_mean);

}  // namespace hyscale::parallel
