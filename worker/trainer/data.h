// Training data for hyscale-train: synthetic multi-query associative recall, token files and raw
// text. No torch: a batch is plain vectors. A batch is a pure function of (job seed, split, batch
// index) -- the random numbers are our own SplitMix64, not <random>'s distributions, so the same
// batch comes back on any standard library -- hence a run's data position is just its step and
// resume is exact.
//
// Recall sequences (token ids from RecallVocab in proto/job_spec.h), T = the batch's seq_len:
//   [0, C)   C = T - 2*queries - 1 context tokens: `pairs` "key value" bigrams (or, with
//            pair_tokens, single (key, value) tokens) at uniformly random non-overlapping
//            positions, filler tokens everywhere else;
//   C        the query marker;
//   (C, T)   `queries` distinct keys of the context, in random order, each followed by its value.
// Keys are distinct within a sequence; values are drawn independently. The target at each query
// key is its value (predict v from k); every other target is -1.
//
// Token and text files are windows of T + 1 tokens (inputs = the first T, targets = the last T).
// The eval split is the held-out tail: the last max(n / 10, T + 1) of the n tokens, the train split
// the rest. A file too short to hold a window in both parts (n < 2 * (T + 1) roughly) serves the
// whole file to both splits.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "hyscale/v1/job.pb.h"

namespace hyscale::trainer {

enum class Split { kTrain, kEval };

struct Batch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;   // [batch_size, seq_len], row-major
  std::vector<int32_t> targets;  // [batch_size, seq_len]; -1 = no loss at that position
};

struct BatchShape {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
};

// Immutable once made; Get may be called from several threads. A batch is a pure function of
// (seed, split, index, shape).
class DataSource {
 public:
  explicit DataSource(BatchShape default_shape) : default_shape_(default_shape) {}
  virtual ~DataSource() = default;
  // seq_len must not exceed data.seq_len (token windows are checked against it).
  virtual Batch Get(Split split, int64_t index, BatchShape shape) const = 0;
  // The data spec's shape.
  Batch Get(Split split, int64_t index) const { return Get(split, index, default_shape_); }
  BatchShape default_shape() const { return default_shape_; }

 private:
  const BatchShape default_shape_;
};

// Validates `spec` (ValidateJobSpec) and opens its data source. Token and text files are mapped
// and scanned once; errors name the spec field, the file and the reason: missing or unreadable
// (the OS error), "short: N tokens, need T + 1", "corrupt: size ... is not a multiple of ...",
// "corrupt: token 70000 at index 123 >= model.vocab_size 50000".
absl::StatusOr<std::unique_ptr<DataSource>> MakeDataSource(const v1::JobSpec& spec);

// How many of the positions with a target (>= 0) the predicted tokens (argmax, same layout as
// Batch::targets) got right.
struct QueryAccuracy {
  int64_t correct = 0;
  int64_t counted = 0;
  double value() const { return counted == 0 ? 0.0 : static_cast<double>(correct) / counted; }
};
// INVALID_ARGUMENT when the two differ in length.
absl::StatusOr<QueryAccuracy> ScoreQueries(const std::vector<int32_t>& predicted,
                                           const std::vector<int32_t>& targets);

}  // namespace hyscale::trainer
