// Training checkpoints: model weights as safetensors (model.safetensors, loadable by PyTorch
// users), AdamW state and the RNG state (optimizer.safetensors), stored through CheckpointStore
// (atomic, checksummed, with fallback). The step is the data position: batches are a pure
// function of it, so resume is exact.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <string>
#include <vector>

#include "worker/trainer/checkpoint_store.h"

namespace hyscale::trainer {

class TrainingCheckpoints {
 public:
  // `attempt`: see CheckpointStore.
  TrainingCheckpoints(std::string dir, int keep, int64_t attempt)
      : store_(std::move(dir), keep, attempt) {}

  // Takes the folder for this attempt (CheckpointStore::Claim).
  absl::Status Claim() { return store_.Claim(); }

  absl::Status Save(int64_t step, const torch::nn::Module& model,
                    const torch::optim::AdamW& optimizer);

  // Restores the newest valid checkpoint and returns its step. NotFound when there is none;
  // FailedPrecondition when it does not fit the model (names the tensor).
  absl::StatusOr<int64_t> LoadLatest(torch::nn::Module& model, torch::optim::AdamW& optimizer,
                                     std::vector<std::string>* warnings);

  std::string PathOf(int64_t step) const { return store_.PathOf(step); }

 private:
  CheckpointStore store_;
};

}  // namespace hyscale::trainer
