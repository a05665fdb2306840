#include "server/planner/planner.h"

#include <absl/strings/str_cat.h>

#include <algorithm>

namespace hyscale::server::planner {
namespace {

constexpr int64_t kFloatBytes = 4;

int64_t AttendedKeys(const v1::JobSpec& spec) {
  const int64_t seq = std::max(1, spec.data().seq_len());
  bool all_sparse = !spec.stages().empty();
  for (const auto& stage : spec.stages()) all_sparse &= stage.attention() == v1::SPARSE;
  if (!all_sparse || spec.model().indexer().topk() <= 0) return seq;
  return std::min<int64_t>(seq, spec.model().indexer().topk());
}

}  // namespace

int64_t ParameterCount(const v1::ModelSpec& m) {
  const int64_t d = m.d_model();
  const int64_t attention = d * m.heads() * m.head_dim_qk() + d * m.head_dim_qk() +
                            d * m.head_dim_v() + int64_t{m.heads()} * m.head_dim_v() * d;
  const auto& ix = m.indexer();
  const int64_t indexer = d * ix.heads() * ix.dim() + d * ix.dim() + d * ix.heads() +
                          2 * int64_t{ix.dim()};  // k_norm weight and bias
  const int64_t mlp = 3 * d * m.d_ff();
  const int64_t norms = 2 * d;
  const int64_t per_layer = attention + indexer + mlp + norms;
  return 2 * int64_t{m.vocab_size()} * d + int64_t{m.layers()} * per_layer + d;
}

MemoryEstimate EstimateMemory(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  MemoryEstimate e;
  e.parameters = ParameterCount(m);
  e.parameter_bytes = kFloatBytes * e.parameters;
  e.gradient_bytes = kFloatBytes * e.parameters;
  e.optimizer_bytes = 2 * kFloatBytes * e.parameters;

  const int64_t tokens =
      int64_t{std::max(1, spec.data().batch_size())} * std::max(1, spec.data().seq_len());
  const int64_t keys = AttendedKeys(spec);
  const int64_t per_token_layer = 6 * int64_t{m.d_model()} + 3 * int64_t{m.d_ff()} +
                                  int64_t{m.heads()} * (m.head_dim_qk() + m.head_dim_v()) +
                                  int64_t{m.indexer().heads()} * m.indexer().dim() +
                                  2 * int64_t{m.heads()} * keys;
  const int64_t full_layer = kFloatBytes * tokens * per_token_layer;
  const int64_t layers = std::max(1, m.layers());
  const int64_t saved = spec.recompute().enabled()
                            ? layers * kFloatBytes * tokens * m.d_model() + full_layer
                            : layers * full_layer;
  const int64_t logits = 2 * kFloatBytes * tokens * m.vocab_size();
  e.activation_bytes = saved + logits;
  const int64_t sum = e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes + e.activation_bytes;
  e.total_bytes = sum + sum / 10;
  return e;
}

PlanShape PlanSingleDevice(const v1::JobSpec& spec) {
  PlanShape plan;
  plan.memory = EstimateMemory(spec);
  const auto& e = plan.memory;
  plan.notes.push_back("single-device plan: context parallelism is not planned yet");
  plan.notes.push_back(absl::StrCat("memory: ", e.parameters, " parameters x 16 B (weights, ",
                                    "gradients, AdamW moments) + ", e.activation_bytes,
                                    " B activations and logits, + 10% slack"));
  plan.notes.push_back("step time: no measured profile covers this model; not estimated");
  return plan;
}

}  // namespace hyscale::server::planner
