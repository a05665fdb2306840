// Reading, defaulting and validating job specs (hyscale.v1.JobSpec). Shared by hyscale-train and
// the coordinator, so it links no torch.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "hyscale/v1/job.pb.h"

namespace hyscale {

enum class SpecFormat { kJson, kYaml };

// Parses JSON (protobuf's JSON mapping: lower_snake_case or lowerCamelCase names, enums by name,
// unknown fields rejected) or YAML. YAML is converted to JSON first: plain scalars that read as
// numbers, true/false or null become those, quoted or explicitly tagged ones stay strings, and a
// key repeated in one map is an error. Errors (INVALID_ARGUMENT) name the field path, or for YAML
// syntax the line and column.
absl::StatusOr<v1::JobSpec> ParseJobSpec(std::string_view text, SpecFormat format);

// Reads a .json, .yaml or .yml file (the format follows the extension). Errors start with the
// path.
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

// Fills the fields whose 0 (or UNSPECIFIED, or "") means "default":
//   model.rope_theta 10000, model.norm_eps 1e-5,
//   optimizer.beta1 0.9, optimizer.beta2 0.95, optimizer.eps 1e-8,
//   checkpoint.keep 2, log_every 10, data.eval_batches 2,
//   stages[i].attention DENSE, stages[i].trains ALL, stages[i].name "stage<i>".
// Left alone because their 0 means something: stages[i].min_lr (decay to 0),
// stages[i].warmup_steps, stages[i].indexer_loss_weight, checkpoint.every_steps (only at the end),
// eval_every (only at stage ends), threads (all cores), model.indexer.rope_dim (no RoPE).
void ApplyDefaults(v1::JobSpec* spec);

// Checks the spec as it will run, i.e. with ApplyDefaults applied (to a copy: `spec` itself may be
// raw or defaulted). Returns INVALID_ARGUMENT listing every problem found, each as
// "field.path: rule (got value)", joined by "; ", so a user fixes them in one go.
// checkpoint.dir may be empty: where checkpoints go is the deployment's choice
// (hyscale-train --checkpoint-dir, the agent), and without a directory none are written.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// "no recomputation", "recomputation with replay" or "recomputation with re-selection": how a
// plan recomputes, in the words the coordinator's and the CLI's messages use.
std::string RecomputeName(const v1::RecomputeSpec& recompute);

// Token ids of the synthetic recall task (data.recall), the one definition shared by the data
// source, validation and the trainer:
//   [0, kFillerCount)                      filler noise between the pairs
//   kQueryMarker                           separates the context from the queries
//   [first_key, first_key + key_count)     keys
//   [first_value, first_value + value_count) values
//   [first_pair, first_pair + pair_count)  with pair_tokens, one token per (key, value):
//                                          first_pair + key_index * value_count + value_index
// model.vocab_size must be >= size().
struct RecallVocab {
  static constexpr int64_t kFillerCount = 16;
  static constexpr int64_t kQueryMarker = kFillerCount;
  static constexpr int64_t kSpecialTokens = kFillerCount + 1;  // fillers and the marker

  int64_t first_key = kSpecialTokens;
  int64_t key_count = 0;
  int64_t first_value = kSpecialTokens;
  int64_t value_count = 0;
  int64_t first_pair = kSpecialTokens;
  int64_t pair_count = 0;  // key_count * value_count with pair_tokens, else 0

  static RecallVocab Of(const v1::RecallData& recall);
  int64_t size() const { return first_pair + pair_count; }
  bool IsKey(int64_t token) const { return token >= first_key && token < first_value; }
  bool IsValue(int64_t token) const { return token >= first_value && token < first_pair; }
  bool IsPair(int64_t token) const { return token >= first_pair && token < size(); }
  int64_t Pair(int64_t key, int64_t value) const {
    return first_pair + (key - first_key) * value_count + (value - first_value);
  }
};

}  // namespace hyscale
