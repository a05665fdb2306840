// One rank's place in a context-parallel training job (DESIGN.md section 5), as the training loop
// uses it: the rendezvous, the communicator(s), the key exchanges of each sequence length, and
// the sums that keep the replicated parameters identical on every rank.
//
// Every rank holds the whole model and reads the same batch; a layer sees only its rank's query
// positions and gathers the key side of the others. The gradient of a replicated parameter is the
// sum of the ranks' gradients, each from the loss of the rank's own tokens.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/key_exchange.h"
#include "worker/parallel/layout.h"
#include "worker/parallel/rendezvous.h"

namespace hyscale::parallel {

class ContextParallelGroup {
 public:
  struct Options {
    RendezvousConfig rendezvous;
    v1::CpLayout layout = v1::CP_LAYOUT_ZIGZAG;
    // Indexer keys travel on a group (NCCL communicator, Gloo connections) of their own, so that
    // their all-gather runs beside the attention keys' instead of after it.
    bool separate_indexer_group = false;
    bool cuda = false;  // NCCL over CUDA tensors, else Gloo over CPU tensors
    // Rank 0: called with "host:port" once its store serves, before the other ranks are awaited.
    std::function<void(const std::string& address)> on_serving;
  };

  // Meets the other ranks; fails after options.rendezvous.timeout if they do not come. Each
  // collective after that fails after options.rendezvous.collective_timeout.
  static absl::StatusOr<std::unique_ptr<ContextParallelGroup>> Join(const Options& options);

  int rank() const { return keys_->rank(); }
  int world_size() const { return keys_->world_size(); }

  // The exchanges for sequences of `seq_len` tokens: `indexer_keys` is null unless the indexer
  // has its own group. Made once per length.
  struct Exchanges {
    std::shared_ptr<ContextParallelExchange> keys;
    std::shared_ptr<ContextParallelExchange> indexer_keys;
  };
  absl::StatusOr<Exchanges> exchanges(int64_t seq_len);

  // t = the sum of every rank's t, in place.
  absl::Status sum(const torch::Tensor& t);
  // Each tensor's grad = the sum over ranks (one collective for all); undefined grads count as 0.
  absl::Status sum_gradients(const std::vector<torch::Tensor>& parameters);

  // Communication since the last call: the exchanges' overlapped and exposed time, plus the
  // gradient sums (exposed: nothing runs beside them).
  CommTimes take_times();

 private:
  ContextParallelGroup(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<Communicator> keys,
                       std::shared_ptr<Communicator> indexer_keys, v1::CpLayout layout);

  c10::intrusive_ptr<c10d::Store> store_;  // kept alive: rank 0 serves it to the others
  std::shared_ptr<Communicator> keys_;
  std::shared_ptr<Communicator> indexer_keys_;  // null: the indexer shares keys_
  v1::CpLayout layout_;
  std::map<int64_t, Exchanges> exchanges_;
  double gradient_sum_s_ = 0;
};

}  // namespace hyscale::parallel
