// hyscale-train: trains the DSA model described by a job spec (JSON or YAML).
//
// Exit codes (proto/constants.h): 0 trained to the end; 2 bad command line, job spec or
// environment (the message names the field, file or variable); 3 out of memory (CUDA or CPU);
// 1 training failed otherwise.
//
// A context-parallel job (spec.parallelism.context_parallel = P > 1) runs as P processes, one
// per rank, each told its place by HYSCALE_WORLD_SIZE, HYSCALE_RANK and HYSCALE_RENDEZVOUS
// (worker/parallel/rendezvous.h); the worker agent sets them, or a person does for a
// standalone run. The agent also sets HYSCALE_ATTEMPT, the job's attempt, which fences the
// checkpoint folder against a trainer of an earlier attempt (worker/trainer/checkpoint_store.h).
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#ifdef HYSCALE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "proto/constants.h"
#include "proto/job_spec.h"
#include "worker/parallel/context_parallel_group.h"
#include "worker/trainer/cuda_shapes.h"
#include "worker/trainer/events.h"
#include "worker/trainer/trainer.h"

namespace {

using hyscale::kExitBadInput;
using hyscale::kExitFailed;
using hyscale::kExitOutOfMemory;

// The trainer reports a failed allocation as a status carrying the allocator's message: torch's
// CUDA "out of memory", its CPU allocator's "can't allocate memory", or std::bad_alloc.
bool OutOfMemory(const absl::Status& status) {
  const std::string message(status.message());
  return message.find("out of memory") != std::string::npos ||
         message.find("can't allocate memory") != std::string::npos ||
         message.find("bad_alloc") != std::string::npos;
}

// The device for the start event. A rank sees only its own GPU (as cuda:0), so the GPU's name and
// PCI bus id (as nvidia-smi shows it) tell which physical GPU each rank trained on.
std::string DescribeDevice(const torch::Device& device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* props = at::cuda::getDeviceProperties(device.index());
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%08X:%02X:%02X.0",
                  static_cast<unsigned>(props->pciDomainID), static_cast<unsigned>(props->pciBusID),
                  static_cast<unsigned>(props->pciDeviceID));
    return device.str() + " " + props->name + " pci " + bus_id;
  }
#endif
  return device.str();
}

// The spec without the stages named in `names` (--skip-stage: an ablation, e.g. training without
// the dense warm-up as its control). A name no stage has is an error that lists the stages.
absl::Status SkipStages(const std::vector<std::string>& names, hyscale::v1::JobSpec* spec) {
  for (const std::string& name : names) {
    auto* stages = spec->mutable_stages();
    const auto named = [&name](const hyscale::v1::StageSpec& s) { return s.name() == name; };
    const auto kept = std::remove_if(stages->begin(), stages->end(), named);
    if (kept == stages->end()) {
      std::vector<std::string> known;
      for (const auto& stage : spec->stages()) known.push_back(stage.name());
      return absl::InvalidArgumentError(absl::StrCat(name, ": the spec has no stage of that name (",
                                                     absl::StrJoin(known, ", "), ")"));
    }
    stages->erase(kept, stages->end());
  }
  return absl::OkStatus();
}

}  // namespace

// The group this process is a rank of; null when it runs alone. Rank 0 reports its store's address
// (the coordinator hands it to the other ranks).
absl::StatusOr<std::shared_ptr<hyscale::parallel::ContextParallelGroup>> join_group(
    const hyscale::v1::ParallelismSpec& parallelism,
    const std::optional<hyscale::parallel::RendezvousConfig>& rendezvous, torch::Device device,
    hyscale::trainer::EventSink& events) {
  namespace parallel = hyscale::parallel;
  if (!rendezvous) return nullptr;
  parallel::ContextParallelGroup::Options options;
  options.rendezvous = *rendezvous;
  auto layout = hyscale::ParseCpLayout(parallelism.cp_layout());
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.cp_layout: ", layout.status().message()));
  }
  options.layout = *layout;
  options.separate_indexer_group = parallelism.separate_indexer_group();
  options.cuda = device.is_cuda();
  options.on_serving = [&events, world = rendezvous->world_size](const std::string& address) {
    events.Rendezvous(address, world);
  };
  auto group = parallel::ContextParallelGroup::Join(options);
  if (!group.ok()) return group.status();
  return std::shared_ptr<parallel::ContextParallelGroup>(*std::move(group));
}

int main(int argc, char** argv) {
  // Long sequences allocate whole-sequence tensors of tens of GiB whose sizes change within a
  // step; the caching allocator's expandable segments map them into one range instead of leaving
  // freed blocks that fit nothing (issue #37: 34 GiB reserved but unusable at 128K). Read at its
  // first allocation; a setting in the environment wins.
  if (std::getenv("PYTORCH_CUDA_ALLOC_CONF") == nullptr &&
      std::getenv("PYTORCH_ALLOC_CONF") == nullptr) {
    setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", /*overwrite=*/0);
  }
  CLI::App app{"hyscale-train: DSA sparse-attention training"};
  std::string config_path, events_path, checkpoint_dir, attention;
  bool resume = false;
  std::optional<bool> recompute, replay;
  bool evaluate = true, indexer_loss = true;
  int threads = -1;
  int query_chunk = -1;
  std::string device_name = "auto";
  std::vector<std::string> skipped_stages;
  bool count_tensor_memory = false;
  app.add_option("-c,--config", config_path, "Job spec (.json, .yaml or .yml)")->required();
  app.add_flag("--resume", resume, "Continue from the newest valid checkpoint");
  app.add_option("--attention", attention, "Override every stage's attention: dense or sparse")
      ->check(CLI::IsMember({"dense", "sparse"}));
  app.add_option("--recompute", recompute, "Override recompute.enabled (true/false)");
  app.add_option("--selection-replay", replay, "Override recompute.selection_replay (true/false)");
  app.add_option("--eval", evaluate,
                 "Evaluate at stage ends and every eval_every steps (true/false; benchmarks "
                 "time the steps alone)");
  app.add_option("--indexer-loss", indexer_loss,
                 "Form the indexer's loss (true/false; false trains no indexer: benchmarks "
                 "measure the loss's share of a step by the difference)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Override checkpoint.dir");
  app.add_option(
      "--query-chunk", query_chunk,
      "Override recompute.query_chunk: queries a layer runs at once (0: fit the device)");
  app.add_option("--skip-stage", skipped_stages,
                 "Train without the stage of this name (repeatable; e.g. a warm-up's control)");
  app.add_option("--events", events_path, "Also write JSON-line events to this file");
  app.add_option("--threads", threads, "CPU threads (overrides the spec's threads)");
  app.add_option("--device", device_name, "Where to train: cpu, cuda, or auto (cuda if present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--count-tensor-memory", count_tensor_memory,
               "CPU: report each step's peak of tensor bytes, by the phase that allocated them "
               "(step events' tensor_memory; slower)");
  CLI11_PARSE(app, argc, argv);

  auto spec = hyscale::LoadJobSpec(config_path);
  if (!spec.ok()) {
    std::cerr << "hyscale-train: " << spec.status().message() << "\n";
    return kExitBadInput;
  }
  if (!checkpoint_dir.empty()) spec->mutable_checkpoint()->set_dir(checkpoint_dir);
  if (threads >= 0) spec->set_threads(threads);
  if (query_chunk != -1) spec->mutable_recompute()->set_query_chunk(query_chunk);
  if (auto status = SkipStages(skipped_stages, &*spec); !status.ok()) {
    std::cerr << "hyscale-train: --skip-stage " << status.message() << "\n";
    return kExitBadInput;
  }
  hyscale::ApplyDefaults(&*spec);
  for (const auto& stage : spec->stages()) {
    if (!indexer_loss && stage.trains() == hyscale::v1::INDEXER_ONLY) {
      std::cerr << "hyscale-train: --indexer-loss false: stage '" << stage.name()
                << "' trains the indexer alone (INDEXER_ONLY), which learns only from the loss\n";
      return kExitBadInput;
    }
  }
  if (auto status = hyscale::ValidateJobSpec(*spec); !status.ok()) {
    std::cerr << "hyscale-train: invalid job spec " << config_path << ": " << status.message()
              << "\n";
    return kExitBadInput;
  }
  const bool cuda = torch::cuda::is_available();
  if (device_name == "cuda" && !cuda) {
    std::cerr << "hyscale-train: --device cuda: no CUDA device is visible to this process\n";
    return kExitBadInput;
  }
  auto rendezvous = hyscale::parallel::RendezvousFromEnv();
  if (!rendezvous.ok()) {
    std::cerr << "hyscale-train: " << rendezvous.status().message() << "\n";
    return kExitBadInput;
  }
  const torch::Device device = hyscale::parallel::RankDevice(
      *rendezvous, device_name == "cuda" || (device_name == "auto" && cuda));
  if (device.is_cuda()) {
    bool sparse = attention == "sparse";
    for (const auto& stage : spec->stages()) sparse |= stage.attention() == hyscale::v1::SPARSE;
    if (auto status = hyscale::trainer::CheckCudaShapes(*spec, sparse); !status.ok()) {
      std::cerr << "hyscale-train: --device cuda: " << status.message() << "\n";
      return kExitBadInput;
    }
  }
  if (count_tensor_memory && device.is_cuda()) {
    std::cerr
        << "hyscale-train: --count-tensor-memory counts CPU tensors: train with --device cpu\n";
    return kExitBadInput;
  }
  const int world = *rendezvous ? (*rendezvous)->world_size : 1;
  const int cp = std::max(1, spec->parallelism().context_parallel());
  if (cp != world) {
    std::cerr << "hyscale-train: parallelism.context_parallel is " << cp
              << " but HYSCALE_WORLD_SIZE is " << world
              << ": run one process per context-parallel rank\n";
    return kExitBadInput;
  }
  torch::set_num_threads(spec->threads() > 0
                             ? spec->threads()
                             : static_cast<int>(std::thread::hardware_concurrency()));

  std::ofstream events_file;
  if (!events_path.empty()) {
    events_file.open(events_path, std::ios::app);
    if (!events_file) {
      std::cerr << "hyscale-train: cannot open --events file " << events_path << "\n";
      return kExitBadInput;
    }
  }
  hyscale::trainer::EventSink events(events_path.empty() ? nullptr : &events_file);

  hyscale::trainer::TrainerOptions options;
  options.resume = resume;
  if (attention == "dense") options.attention = hyscale::trainer::AttentionMode::kDense;
  if (attention == "sparse") options.attention = hyscale::trainer::AttentionMode::kSparse;
  options.recompute = recompute;
  options.selection_replay = replay;
  options.evaluate = evaluate;
  options.indexer_loss = indexer_loss;
  options.device = device;
  options.count_tensor_memory = count_tensor_memory;
  // Under the service the agent names the job's attempt: it fences the checkpoint folder.
  if (const char* attempt = std::getenv("HYSCALE_ATTEMPT"); attempt != nullptr) {
    if (!absl::SimpleAtoi(attempt, &options.attempt) || options.attempt < 0) {
      std::cerr << "hyscale-train: HYSCALE_ATTEMPT: must be a number >= 0 (got '" << attempt
                << "')\n";
      return kExitBadInput;
    }
  }

  events.JobStarted(*spec, DescribeDevice(device));
  auto group = join_group(spec->parallelism(), *rendezvous, device, events);
  if (!group.ok()) {
    std::cerr << "hyscale-train: joining the context-parallel group: " << group.status().message()
              << "\n";
    events.JobFinished(group.status());
    return kExitFailed;
  }
  options.context_parallel = *std::move(group);
  // Building the model allocates it: an exception there (out of memory) becomes a status too.
  absl::StatusOr<std::unique_ptr<hyscale::trainer::Trainer>> trainer =
      absl::InternalError("not created");
  try {
    trainer = hyscale::trainer::Trainer::Create(*spec, options, events);
  } catch (const std::exception& e) {
    trainer = absl::InternalError(absl::StrCat("building the model: ", e.what()));
  }
  if (!trainer.ok()) {
    std::cerr << "hyscale-train: " << trainer.status().message() << "\n";
    events.JobFinished(trainer.status());
    const auto code = trainer.status().code();
    const bool bad_input = code == absl::StatusCode::kInvalidArgument ||
                           code == absl::StatusCode::kNotFound ||
                           code == absl::StatusCode::kPermissionDenied;
    if (bad_input) return kExitBadInput;
    return OutOfMemory(trainer.status()) ? kExitOutOfMemory : kExitFailed;
  }
  const auto status = (*trainer)->Run();
  events.JobFinished(status);
  if (!status.ok()) {
    std::cerr << "hyscale-train: " << status.message() << "\n";
    const int code = OutOfMemory(status) ? kExitOutOfMemory : kExitFailed;
    if (options.context_parallel) {
      // A failed collective may still run on the device or wait for a dead peer, and tearing
      // the process group down waits for it (NCCL's does, for as long as the peer is gone).
      // Leave without destructors, outputs flushed.
      std::cout.flush();
      std::cerr.flush();
      if (events_file.is_open()) events_file.flush();
      std::_Exit(code);
    }
    return code;
  }
  return hyscale::kExitOk;
}
