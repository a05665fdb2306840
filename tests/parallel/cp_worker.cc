// One rank of a context-parallel test group (spawned by rank_processes.cc):
//   cp_worker <mode> <rank> <world> <store port> [mode arguments]
// Exit codes: 0 the checks passed, 1 a check failed (stderr says which), 3 a collective failed
// as the lost-rank modes expect.
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "worker/model/recompute.h"
#include "worker/parallel/gloo_communicator.h"
#include "worker/parallel/key_exchange.h"
#include "worker/parallel/rendezvous.h"

namespace hyscale::parallel {
namespace {

using Clock = std::chrono::steady_clock;

int fail(const std::string& what) {
  std::cerr << what << "\n";
  return 1;
}

// Every collective against values each rank can predict.
int run_collectives(Communicator& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  // all_gather: rank r contributes rows filled with r.
  const auto mine = at::full({3, 2}, static_cast<double>(rank), opts);
  auto gathered = at::empty({3 * world, 2}, opts);
  auto work = comm.all_gather_async(gathered, mine);
  if (auto s = work->wait(comm.timeout()); !s.ok()) return fail(s.ToString());
  const auto expected = at::arange(world, opts).repeat_interleave(3).unsqueeze(1).expand({-1, 2});
  if (!at::equal(gathered, expected)) return fail("all_gather: wrong result");
  if (!work->finished_at().has_value() || *work->finished_at() < work->launched_at()) {
    return fail("all_gather: no completion time");
  }
  // reduce_scatter: rank r sends value (r + 1) * (chunk + 1); chunk c gets sum_r (r+1)(c+1).
  const auto chunks = (at::arange(world, opts) + 1).repeat_interleave(2).view({2 * world, 1});
  const auto in = chunks * (rank + 1);
  auto out = at::empty({2, 1}, opts);
  if (auto s = comm.reduce_scatter(out, in); !s.ok()) return fail(s.ToString());
  const double ranks_sum = world * (world + 1) / 2.0;
  if (!at::allclose(out, at::full({2, 1}, ranks_sum * (rank + 1), opts))) {
    return fail("reduce_scatter: wrong result");
  }
  auto t = at::full({5}, static_cast<double>(rank), opts);
  if (auto s = comm.all_reduce(t); !s.ok()) return fail(s.ToString());
  if (!at::allclose(t, at::full({5}, world * (world - 1) / 2.0, opts))) {
    return fail("all_reduce: wrong result");
  }
  if (auto s = comm.barrier(); !s.ok()) return fail(s.ToString());
  return 0;
}

// The last rank dies (SIGKILL) or hangs (stops calling collectives) after joining; the others
// must fail their next collective within the timeout, with an error naming it.
int run_lost_rank(Communicator& comm, bool hang) {
  if (auto s = comm.barrier(); !s.ok()) return fail(s.ToString());
  if (comm.rank() == comm.world_size() - 1) {
    if (!hang) ::raise(SIGKILL);
    std::this_thread::sleep_for(comm.timeout() + std::chrono::seconds(1));
    ::_exit(0);
  }
  const auto start = Clock::now();
  auto t = at::ones({1024});
  for (int i = 0; i < 100; ++i) {
    const auto s = comm.all_reduce(t);
    if (!s.ok()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::cerr << "failed after " << seconds << " s: " << s.ToString() << "\n";
      return 3;
    }
  }
  return fail("all_reduce kept succeeding with a dead rank");
}

// A tiny DSA layer in double precision: topk < N, so selection really selects.
trainer::ModelConfig layer_config() {
  trainer::ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 32;
  c.layers = 1;
  c.heads = 2;
  c.head_dim_qk = 16;
  c.rope_dim = 8;
  c.head_dim_v = 8;
  c.d_ff = 48;
  c.index_heads = 2;
  c.index_dim = 8;
  c.index_rope_dim = 4;
  c.topk = 6;
  return c;
}

struct LayerRun {
  trainer::LayerOutput out;
  torch::Tensor loss;  // the indexer loss, as the layer returned it
  torch::Tensor x_grad;
  std::vector<torch::Tensor> param_grads;
};

// Forward and backward of sum(out * weight) + loss_scale * indexer_loss.
LayerRun forward_backward(trainer::DsaLayer& layer, const torch::Tensor& x,
                          const torch::Tensor& weight, double loss_scale,
                          const trainer::ForwardOptions& options) {
  layer->zero_grad();
  trainer::SelectionStats stats;
  const auto input = x.detach().requires_grad_(true);
  LayerRun run;
  // Under recomputation the loss's value comes from the backward's recomputation.
  const auto recomputed_loss = torch::zeros({}, x.options());
  if (options.frozen_main) {
    // Only the indexer learns, inside the forward; the input gets no gradient.
    run.out = layer->forward_frozen(input, options, loss_scale, stats);
    run.loss = run.out.indexer_loss;
    run.x_grad = torch::zeros_like(x);
  } else {
    run.out = options.recompute ? trainer::checkpointed_layer(layer, input, options, stats,
                                                              recomputed_loss, /*report_scale=*/1.0)
                                : layer->forward(input, options, {}, stats);
    ((run.out.x * weight).sum() + loss_scale * run.out.indexer_loss).backward();
    run.loss = options.recompute ? recomputed_loss.to(x.scalar_type()) : run.out.indexer_loss;
    run.x_grad = input.grad();
  }
  for (const auto& p : layer->parameters()) {
    run.param_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  return run;
}

bool close(const char* what, const torch::Tensor& got, const torch::Tensor& want) {
  if (got.sizes() == want.sizes() && torch::allclose(got, want, 1e-9, 1e-11)) return true;
  std::cerr << what << " differs: max |diff| "
            << (got.sizes() == want.sizes() ? (got - want).abs().max().item<double>() : -1.0)
            << "\n";
  return false;
}

// For each layout and forward variant (chunked queries and the frozen main model of INDEXER_ONLY
// stages included), with values of their own and with
// a latent (values = the keys' first features, exchanged as part of the keys): the context-parallel
// layer's outputs, selection, indexer loss (across shards) and gradients (parameters summed over
// ranks, inputs per shard) equal the single-process layer's on the whole sequence.
int run_layer(const std::shared_ptr<Communicator>& comm, const trainer::ModelConfig& config,
              const std::string& label) {
  const int world = comm->world_size();
  const int64_t batch = 2, seq_len = 8 * world;
  torch::manual_seed(7);  // the same layer and data on every rank
  auto layer = trainer::DsaLayer(config);
  layer->to(torch::kDouble);
  const auto x = torch::randn({batch, seq_len, 32}, torch::kDouble);
  const auto weight = torch::randn({batch, seq_len, 32}, torch::kDouble);
  struct Variant {
    const char* name;
    trainer::AttentionMode attention;
    bool recompute;
    int64_t query_chunk;       // each rank's chunks of its own 8 queries (3: a short last one)
    bool frozen_main = false;  // INDEXER_ONLY: the indexer learns inside the forward
  };
  bool ok = true;
  for (const Variant& v :
       {Variant{"sparse", trainer::AttentionMode::kSparse, false, 0},
        Variant{"sparse+recompute", trainer::AttentionMode::kSparse, true, 0},
        Variant{"sparse+recompute+chunks", trainer::AttentionMode::kSparse, true, 3},
        Variant{"dense", trainer::AttentionMode::kDense, false, 0},
        Variant{"dense+recompute+chunks", trainer::AttentionMode::kDense, true, 3},
        Variant{"frozen dense+chunks", trainer::AttentionMode::kDense, false, 3, true},
        Variant{"frozen sparse", trainer::AttentionMode::kSparse, false, 0, true}}) {
    trainer::ForwardOptions options;
    options.attention = v.attention;
    options.recompute = v.recompute;
    options.frozen_main = v.frozen_main;
    // The reference is the whole sequence unchunked.
    const LayerRun whole = forward_backward(layer, x, weight, 1.0, options);
    options.query_chunk = v.query_chunk;
    for (v1::CpLayout layout : kCpLayouts) {
      auto exchange = ContextParallelExchange::Create(comm, layout, seq_len);
      if (!exchange.ok()) return fail(exchange.status().ToString());
      const auto pos = (*exchange)->positions();
      options.key_exchange = *exchange;
      // Each rank's share of the global mean loss: its local mean / world.
      const LayerRun shard = forward_backward(layer, x.index_select(1, pos),
                                              weight.index_select(1, pos), 1.0 / world, options);
      const std::string what = label + v.name + " " + CpLayoutName(layout) + ": ";
      ok &= close((what + "output").c_str(), shard.out.x, whole.out.x.index_select(1, pos));
      ok &=
          close((what + "input gradient").c_str(), shard.x_grad, whole.x_grad.index_select(1, pos));
      // The frozen model returns no selection (nothing replays it).
      if (v.attention == trainer::AttentionMode::kSparse && !v.frozen_main &&
          !torch::equal(shard.out.indices, whole.out.indices.index_select(1, pos))) {
        ok = fail(what + "selection differs") == 0;
      }
      auto loss = MeanAcrossRanks(*comm, shard.loss);
      if (!loss.ok()) return fail(loss.status().ToString());
      ok &= close((what + "indexer loss").c_str(), *loss, whole.loss);
      for (size_t i = 0; i < shard.param_grads.size(); ++i) {
        if (auto s = comm->all_reduce(shard.param_grads[i]); !s.ok()) return fail(s.ToString());
        ok &= close((what + "gradient of parameter " + std::to_string(i)).c_str(),
                    shard.param_grads[i], whole.param_grads[i]);
      }
      const CommTimes times = (*exchange)->take_times();
      std::cerr << what << "communication " << times.overlapped_s * 1e3 << " ms overlapped, "
                << times.exposed_s * 1e3 << " ms exposed\n";
    }
  }
  return ok ? 0 : 1;
}

int run_layer(const std::shared_ptr<Communicator>& comm) {
  int status = 0;
  for (const bool latent : {false, true}) {
    auto config = layer_config();
    config.latent_kv = latent;
    status |= run_layer(comm, config, latent ? "latent " : "");
  }
  return status;
}

int run(int argc, char** argv) {
  if (argc < 5) return fail("usage: cp_worker <mode> <rank> <world> <port> [args]");
  const std::string mode = argv[1];
  const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]), port = std::atoi(argv[4]);
  const bool lost_rank = mode == "dead_rank" || mode == "stuck_rank";
  const auto timeout = std::chrono::milliseconds(lost_rank ? 3000 : 30000);
  RendezvousConfig config;
  config.port = port;
  config.rank = rank;
  config.world_size = world;
  config.serve_store = false;
  config.timeout = timeout;
  auto store = ConnectStore(config);
  if (!store.ok()) return fail(store.status().ToString());
  GlooOptions options;
  options.timeout = timeout;
  auto comm = ConnectGloo(*store, rank, world, options);
  if (!comm.ok()) return fail(comm.status().ToString());
  if (mode == "collectives") return run_collectives(**comm);
  if (mode == "layer") return run_layer(std::shared_ptr<Communicator>(std::move(*comm)));
  if (lost_rank) {
    const int code = run_lost_rank(**comm, mode == "stuck_rank");
    // The group's destructor would wait for the failed peer's connections: leave at once.
    std::cerr.flush();
    ::_exit(code);
  }
  return fail("unknown mode " + mode);
}

}  // namespace
}  // namespace hyscale::parallel

int main(int argc, char** argv) {
  return hyscale::parallel::run(argc, argv);
}
