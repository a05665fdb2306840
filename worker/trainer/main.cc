// hyscale-train: trains the DSA model described by a job spec (JSON or YAML).
//
// Exit codes: 0 trained to the end; 2 bad command line or job spec (the message names the field
// or file); 1 training failed.
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "proto/job_spec.h"
#include "worker/trainer/events.h"
#include "worker/trainer/trainer.h"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hyscale-train: DSA sparse-attention training"};
  std::string config_path, events_path, checkpoint_dir, attention;
  bool resume = false;
  std::optional<bool> recompute, replay;
  int threads = -1;
  app.add_option("-c,--config", config_path, "Job spec (.json, .yaml or .yml)")->required();
  app.add_flag("--resume", resume, "Continue from the newest valid checkpoint");
  app.add_option("--attention", attention, "Override every stage's attention: dense or sparse")
      ->check(CLI::IsMember({"dense", "sparse"}));
  app.add_option("--recompute", recompute, "Override recompute.enabled (true/false)");
  app.add_option("--selection-replay", replay, "Override recompute.selection_replay (true/false)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Override checkpoint.dir");
  app.add_option("--events", events_path, "Also write JSON-line events to this file");
  app.add_option("--threads", threads, "CPU threads (overrides the spec's threads)");
  CLI11_PARSE(app, argc, argv);

  auto spec = hyscale::LoadJobSpec(config_path);
  if (!spec.ok()) {
    std::cerr << "hyscale-train: " << spec.status().message() << "\n";
    return kExitBadInput;
  }
  if (!checkpoint_dir.empty()) spec->mutable_checkpoint()->set_dir(checkpoint_dir);
  if (threads >= 0) spec->set_threads(threads);
  hyscale::ApplyDefaults(&*spec);
  if (auto status = hyscale::ValidateJobSpec(*spec); !status.ok()) {
    std::cerr << "hyscale-train: invalid job spec " << config_path << ": " << status.message()
              << "\n";
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

  events.JobStarted(*spec);
  auto trainer = hyscale::trainer::Trainer::Create(*spec, options, events);
  if (!trainer.ok()) {
    std::cerr << "hyscale-train: " << trainer.status().message() << "\n";
    events.JobFinished(trainer.status());
    const auto code = trainer.status().code();
    const bool bad_input = code == absl::StatusCode::kInvalidArgument ||
                           code == absl::StatusCode::kNotFound ||
                           code == absl::StatusCode::kPermissionDenied;
    return bad_input ? kExitBadInput : kExitFailed;
  }
  const auto status = (*trainer)->Run();
  events.JobFinished(status);
  if (!status.ok()) {
    std::cerr << "hyscale-train: " << status.message() << "\n";
    return kExitFailed;
  }
  return 0;
}
