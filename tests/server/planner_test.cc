#include "server/planner/planner.h"

#include <gtest/gtest.h>

namespace hyscale::server::planner {
namespace {

v1::JobSpec Spec() {
  v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_vocab_size(100);
  m->set_d_model(32);
  m->set_layers(2);
  m->set_heads(4);
  m->set_head_dim_qk(16);
  m->set_head_dim_v(8);
  m->set_d_ff(64);
  m->mutable_indexer()->set_heads(2);
  m->mutable_indexer()->set_dim(8);
  m->mutable_indexer()->set_topk(16);
  spec.mutable_data()->set_seq_len(64);
  spec.mutable_data()->set_batch_size(2);
  spec.add_stages()->set_attention(v1::DENSE);
  return spec;
}

TEST(PlannerTest, ParameterCountFollowsTheModelLayout) {
  const auto spec = Spec();
  const int64_t d = 32;
  const int64_t attention = d * 4 * 16 + d * 16 + d * 8 + 4 * 8 * d;
  const int64_t indexer = d * 2 * 8 + d * 8 + d * 2 + 2 * 8;
  const int64_t per_layer = attention + indexer + 3 * d * 64 + 2 * d;
  EXPECT_EQ(ParameterCount(spec.model()), 2 * 100 * d + 2 * per_layer + d);
}

TEST(PlannerTest, MemoryGrowsWithBatchAndShrinksWithRecompute) {
  auto spec = Spec();
  const auto base = EstimateMemory(spec);
  EXPECT_EQ(base.optimizer_bytes, 8 * base.parameters);
  EXPECT_GT(base.total_bytes, base.parameter_bytes + base.gradient_bytes + base.optimizer_bytes);
  spec.mutable_data()->set_batch_size(8);
  EXPECT_GT(EstimateMemory(spec).activation_bytes, base.activation_bytes);
  spec.mutable_recompute()->set_enabled(true);
  auto recompute = EstimateMemory(spec);
  spec.mutable_recompute()->set_enabled(false);
  EXPECT_LT(recompute.activation_bytes, EstimateMemory(spec).activation_bytes);
}

TEST(PlannerTest, SingleDevicePlan) {
  const auto plan = PlanSingleDevice(Spec());
  EXPECT_EQ(plan.ranks, 1);
  EXPECT_EQ(plan.context_parallel, 1);
  EXPECT_EQ(plan.cp_layout, "none");
  EXPECT_EQ(plan.query_group, 1);
  EXPECT_GT(plan.memory.total_bytes, 0);
  EXPECT_FALSE(plan.notes.empty());
}

}  // namespace
}  // namespace hyscale::server::planner
