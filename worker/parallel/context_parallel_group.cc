#include "worker/parallel/context_parallel_group.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#ifdef HYSCALE_HAVE_GLOO
#include "worker/parallel/gloo_communicator.h"
#endif
#ifdef HYSCALE_HAVE_NCCL
#include "worker/parallel/nccl_communicator.h"
#endif

namespace hyscale::parallel {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::unique_ptr<Communicator>> connect(const c10::intrusive_ptr<c10d::Store>& store,
                                                      const ContextParallelGroup::Options& options,
                                                      const std::string& group) {
  const RendezvousConfig& rdv = options.rendezvous;
  if (options.cuda) {
#ifdef HYSCALE_HAVE_NCCL
    NcclOptions nccl;
    nccl.timeout = rdv.collective_timeout;
    nccl.group = group;
    return ConnectNccl(store, rdv.rank, rdv.world_size, nccl);
#else
    return absl::FailedPreconditionError(
        "context parallelism on CUDA needs NCCL, and this build has none");
#endif
  }
#ifdef HYSCALE_HAVE_GLOO
  GlooOptions gloo;
  // Ranks meeting on loopback talk over it; otherwise each uses its hostname's address.
  const bool loopback = rdv.host == "127.0.0.1" || rdv.host == "localhost";
  gloo.hostname = loopback ? "127.0.0.1" : "";
  gloo.timeout = rdv.collective_timeout;
  gloo.group = group;
  return ConnectGloo(store, rdv.rank, rdv.world_size, gloo);
#else
  return absl::FailedPreconditionError(
      "context parallelism on CPU needs Gloo, and this build has none (install libgloo-dev)");
#endif
}

// Every rank checks in at the store and waits for the others with the rendezvous deadline: peers
// may start long after rank 0 (the coordinator starts them once it published its address), while
// the groups made after this use the much shorter collective deadline for everything.
absl::Status meet(c10d::Store& store, const RendezvousConfig& rdv) {
  std::vector<std::string> keys;
  for (int r = 0; r < rdv.world_size; ++r) keys.push_back(absl::StrCat("hyscale/joined/", r));
  try {
    store.set(keys[rdv.rank], std::vector<uint8_t>{1});
    store.wait(keys, rdv.timeout);
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat("rank ", rdv.rank, " of ", rdv.world_size,
                                                    ": not every rank arrived within ",
                                                    rdv.timeout.count(), " ms: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ContextParallelGroup>> ContextParallelGroup::Join(
    const Options& options) {
  int served_port = 0;
  auto store = ConnectStore(options.rendezvous, &served_port);
  if (!store.ok()) return store.status();
  if (options.rendezvous.serve_store && options.on_serving) {
    options.on_serving(absl::StrCat(options.rendezvous.host, ":", served_port));
  }
  if (auto status = meet(**store, options.rendezvous); !status.ok()) return status;
  auto keys = connect(*store, options, "cp");
  if (!keys.ok()) return keys.status();
  std::shared_ptr<Communicator> indexer_keys;
  if (options.separate_indexer_group) {
    auto group = connect(*store, options, "cp-indexer");
    if (!group.ok()) return group.status();
    indexer_keys = std::move(*group);
  }
  return std::unique_ptr<ContextParallelGroup>(new ContextParallelGroup(
      *std::move(store), std::move(*keys), std::move(indexer_keys), options.layout));
}

ContextParallelGroup::ContextParallelGroup(c10::intrusive_ptr<c10d::Store> store,
                                           std::shared_ptr<Communicator> keys,
                                           std::shared_ptr<Communicator> indexer_keys,
                                           v1::CpLayout layout)
    : store_(std::move(store)),
      keys_(std::move(keys)),
      indexer_keys_(std::move(indexer_keys)),
      layout_(layout) {}

absl::StatusOr<ContextParallelGroup::Exchanges> ContextParallelGroup::exchanges(int64_t seq_len) {
  const auto found = exchanges_.find(seq_len);
  if (found != exchanges_.end()) return found->second;
  Exchanges made;
  auto keys = ContextParallelExchange::Create(keys_, layout_, seq_len);
  if (!keys.ok()) return keys.status();
  made.keys = *std::move(keys);
  if (indexer_keys_) {
    auto indexer = ContextParallelExchange::Create(indexer_keys_, layout_, seq_len);
    if (!indexer.ok()) return indexer.status();
    made.indexer_keys = *std::move(indexer);
  }
  exchanges_.emplace(seq_len, made);
  return made;
}

absl::Status ContextParallelGroup::sum(const torch::Tensor& t) {
  return keys_->all_reduce(t);
}

absl::Status ContextParallelGroup::sum_gradients(const std::vector<torch::Tensor>& parameters) {
  const auto start = Clock::now();
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return absl::OkStatus();
  std::vector<torch::Tensor> flat_parts;
  for (const auto& g : grads) flat_parts.push_back(g.reshape(-1));
  auto flat = torch::cat(flat_parts);
  if (auto status = keys_->all_reduce(flat); !status.ok()) return status;
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  gradient_sum_s_ += std::chrono::duration<double>(Clock::now() - start).count();
  return absl::OkStatus();
}

CommTimes ContextParallelGroup::take_times() {
  CommTimes total;
  for (auto& [length, made] : exchanges_) {
    for (const auto& exchange : {made.keys, made.indexer_keys}) {
      if (!exchange) continue;
      const CommTimes times = exchange->take_times();
      total.overlapped_s += times.overlapped_s;
      total.exposed_s += times.exposed_s;
    }
  }
  total.exposed_s += gradient_sum_s_;
  gradient_sum_s_ = 0;
  return total;
}

}  // namespace hyscale::parallel
