// The small job spec the CLI tests submit (validated by the CLI; run by fake trainers).
#pragma once

#include <string>

namespace hyscale::cli::testing {

inline constexpr char kTinySpec[] = R"(name: tiny
seed: 1
model:
  vocab_size: 160
  d_model: 32
  layers: 1
  heads: 2
  head_dim_qk: 16
  rope_dim: 8
  head_dim_v: 16
  d_ff: 64
  indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 16}
data:
  seq_len: 64
  batch_size: 2
  recall: {pairs: 4, queries: 4, key_vocab: 64, value_vocab: 64}
stages:
  - {name: dense, steps: 20, lr: 1.0e-3, attention: DENSE, trains: ALL}
checkpoint: {every_steps: 5}
)";

// The same job with its stage sparse: what planning a query group G needs.
inline std::string TinySparseSpec() {
  std::string spec = kTinySpec;
  const std::string dense = "attention: DENSE";
  spec.replace(spec.find(dense), dense.size(), "attention: SPARSE");
  return spec;
}

}  // namespace hyscale::cli::testing
