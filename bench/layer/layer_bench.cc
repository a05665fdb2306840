// hyscale-layer-bench: the trainer's own DSA layer (worker/model), timed as hyscale-train runs it:
// one layer's step = the recomputed forward (checkpointed_layer, selection replay) and its
// backward, under bf16 autocast on a GPU, with the step's phases timed on the device by the
// trainer's PhaseClock. bench/dsa_layer_bench.py runs it for the HyScale side of its comparison.
//
//   hyscale-layer-bench --sizes 32768,65536 [--query-chunk 8192] [--device cuda] [shape flags]
//
// Under context parallelism each rank is one process, placed as hyscale-train's ranks are
// (HYSCALE_WORLD_SIZE, HYSCALE_RANK, HYSCALE_RENDEZVOUS; worker/parallel/rendezvous.h): the
// layer then runs the trainer's key exchange in --cp-layout and sums the replicated parameters'
// gradients, and each rank prints its own lines with "rank" and "comm" (exposed and overlapped
// seconds a step). bench/cp_layer_bench.py launches them.
//
// One JSON object a line on stdout, per N: {"n", "query_chunk", "step_seconds": {"median",
// "min", "max"}, "phase_seconds": {name: median}, "peak_memory_bytes", "device"}, or {"n",
// "query_chunk", "oom": message} when the step does not fit.
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#ifdef HYSCALE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "kernels/torch/compat.h"
#include "proto/cp_layout.h"
#include "worker/model/model.h"
#include "worker/model/recompute.h"
#include "worker/parallel/context_parallel_group.h"

namespace hyscale::trainer {
namespace {

struct Flags {
  std::vector<int64_t> sizes{32768};
  int runs = 5, warmup = 2;
  int64_t query_chunk = 0;
  std::string device = "cuda";
  std::string cp_layout = "zigzag";
  ModelConfig model;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void reset_peak(torch::Device device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

// The CUDA caching allocator's peak since reset_peak; 0 on the CPU (no allocator to ask).
int64_t peak_bytes(torch::Device device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  }
#endif
  (void)device;
  return 0;
}

void throw_if_error(const absl::Status& status) {
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

// `group`: this rank's context-parallel group, or null for the whole sequence in one process.
nlohmann::json measure(const Flags& flags, int64_t n, torch::Device device,
                       parallel::ContextParallelGroup* group) {
  torch::manual_seed(1);  // the same layer and sequence on every rank
  DsaLayer layer(flags.model);
  layer->to(device);
  auto x = torch::randn({1, n, flags.model.d_model}, torch::dtype(torch::kFloat).device(device));
  auto grad = torch::randn_like(x);
  ForwardOptions options;
  if (group != nullptr) {
    auto exchanges = group->exchanges(n);
    throw_if_error(exchanges.status());
    options.key_exchange = exchanges->keys;
    options.indexer_key_exchange = exchanges->indexer_keys;
    const auto rows = exchanges->keys->positions().to(device);
    x = x.index_select(1, rows);
    grad = grad.index_select(1, rows);
  }
  options.attention = AttentionMode::kSparse;
  options.recompute = true;
  options.selection_replay = true;
  options.bf16_autocast = device.is_cuda();
  options.query_chunk = flags.query_chunk;
  options.clock = c10::make_intrusive<PhaseClock>(device);
  SelectionStats stats;
  std::vector<double> steps, exposed, overlapped;
  std::map<std::string, std::vector<double>> phases;
  reset_peak(device);
  for (int run = 0; run < flags.warmup + flags.runs; ++run) {
    layer->zero_grad();
    PhaseClock& clock = *options.clock;
    clock.start();
    torch::Tensor out;
    {
      compat::CudaBf16Autocast autocast(options.bf16_autocast);
      const auto input = x.detach().requires_grad_(true);
      const auto loss_report = torch::zeros({}, x.options());
      const LayerOutput o = checkpointed_layer(layer, input, options, stats, loss_report, 1.0);
      out = (o.x * grad).sum() + o.indexer_loss;
    }
    {
      PhaseClock::PassGuard pass(clock, v1::STEP_PASS_BWD);
      {
        PhaseClock::BackwardAttribution attribution(clock);
        out.backward();
      }
      if (group != nullptr) {
        PhaseClock::Scope scope(clock, v1::STEP_PHASE_COMM);
        throw_if_error(group->sum_gradients(layer->parameters()));
      }
    }
    const auto seconds = clock.take();
    const parallel::CommTimes comm = group != nullptr ? group->take_times() : parallel::CommTimes{};
    if (run < flags.warmup) continue;
    double total = 0;
    for (const auto& [name, s] : seconds) {
      phases[name].push_back(s);
      total += s;
    }
    steps.push_back(total);
    exposed.push_back(comm.exposed_s);
    overlapped.push_back(comm.overlapped_s);
  }
  nlohmann::json r;
  r["n"] = n;
  r["query_chunk"] = flags.query_chunk;
  r["device"] = device.str();
  r["step_seconds"] = {{"median", median(steps)},
                       {"min", *std::min_element(steps.begin(), steps.end())},
                       {"max", *std::max_element(steps.begin(), steps.end())}};
  for (auto& [name, values] : phases) r["phase_seconds"][name] = median(values);
  r["peak_memory_bytes"] = peak_bytes(device);
  if (group != nullptr) {
    r["rank"] = group->rank();
    r["world"] = group->world_size();
    r["layout"] = flags.cp_layout;
    r["comm"] = {{"exposed", median(exposed)}, {"overlapped", median(overlapped)}};
  }
  return r;
}

int run(int argc, char** argv) {
  Flags flags;
  ModelConfig& m = flags.model;
  // DeepSeek-V3.2's attention with the trainer's reference width (examples/train-ref-2048x4).
  m.vocab_size = 256;
  m.d_model = 2048;
  m.layers = 1;
  m.heads = 128;
  m.head_dim_qk = 576;
  m.rope_dim = 64;
  m.head_dim_v = 512;
  m.latent_kv = true;
  m.d_ff = 5632;
  m.index_heads = 64;
  m.index_dim = 128;
  m.index_rope_dim = 64;
  m.topk = 2048;
  CLI::App app{"hyscale-layer-bench: the trainer's DSA layer step, timed on the device"};
  app.add_option("--sizes", flags.sizes, "Sequence lengths N")->delimiter(',');
  app.add_option("--runs", flags.runs, "Timed steps a size")->check(CLI::PositiveNumber);
  app.add_option("--warmup", flags.warmup, "Untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--query-chunk", flags.query_chunk, "Queries the layer runs at once (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", flags.device, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--cp-layout", flags.cp_layout,
                 "Context parallelism's layout under HYSCALE_WORLD_SIZE > 1");
  app.add_option("--d-model", m.d_model, "Model width")->check(CLI::PositiveNumber);
  app.add_option("--d-ff", m.d_ff, "SwiGLU width")->check(CLI::PositiveNumber);
  app.add_option("--heads", m.heads, "Attention heads H")->check(CLI::PositiveNumber);
  app.add_option("--dqk", m.head_dim_qk, "Key width d_qk")->check(CLI::PositiveNumber);
  app.add_option("--dv", m.head_dim_v, "Value width d_v")->check(CLI::PositiveNumber);
  app.add_option("--rope", m.rope_dim, "RoPE features")->check(CLI::NonNegativeNumber);
  app.add_option("--latent", m.latent_kv, "Values are the keys' first d_v features (true/false)");
  app.add_option("--heads-i", m.index_heads, "Indexer heads H_I")->check(CLI::PositiveNumber);
  app.add_option("--dim-i", m.index_dim, "Indexer width d_I")->check(CLI::PositiveNumber);
  app.add_option("--rope-i", m.index_rope_dim, "Indexer RoPE features")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--topk", m.topk, "Selected keys k")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (flags.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "hyscale-layer-bench: --device cuda: no CUDA device is visible\n";
    return 2;
  }
  for (const int64_t n : flags.sizes) {
    if (n < m.topk) {
      std::cerr << "hyscale-layer-bench: --sizes: " << n << " is shorter than --topk " << m.topk
                << "\n";
      return 2;
    }
  }
  const auto layout = ParseCpLayout(flags.cp_layout);
  if (!layout.ok()) {
    std::cerr << "hyscale-layer-bench: --cp-layout: " << layout.status().message() << "\n";
    return 2;
  }
  const auto rendezvous = parallel::RendezvousFromEnv();
  if (!rendezvous.ok()) {
    std::cerr << "hyscale-layer-bench: " << rendezvous.status().message() << "\n";
    return 2;
  }
  const bool cuda = flags.device == "cuda";
  const torch::Device device = parallel::RankDevice(*rendezvous, cuda);
  std::unique_ptr<parallel::ContextParallelGroup> group;
  if (rendezvous->has_value()) {
    parallel::ContextParallelGroup::Options options;
    options.rendezvous = **rendezvous;
    options.layout = *layout;
    options.cuda = cuda;
    auto joined = parallel::ContextParallelGroup::Join(options);
    if (!joined.ok()) {
      std::cerr << "hyscale-layer-bench: joining the group: " << joined.status().message() << "\n";
      return 1;
    }
    group = *std::move(joined);
  }
  for (const int64_t n : flags.sizes) {
    nlohmann::json row;
    try {
      row = measure(flags, n, device, group.get());
    } catch (const c10::Error& e) {
      // Out of memory is an answer (the size does not fit), anything else a failure.
      const std::string what = e.what_without_backtrace();
      if (what.find("out of memory") == std::string::npos) throw;
      row = {{"n", n}, {"query_chunk", flags.query_chunk}, {"oom", what.substr(0, 200)}};
    }
    std::cout << row.dump() << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace hyscale::trainer

int main(int argc, char** argv) {
  return hyscale::trainer::run(argc, argv);
}
