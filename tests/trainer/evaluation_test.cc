// Evaluation's indexer recall: the forward's probes keep only the rows it scores, and the recall
// is the one that every row's probes give.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/model/small_model.h"
#include "worker/model/model.h"
#include "worker/trainer/evaluation.h"

namespace hyscale::trainer {
namespace {

TEST(EvaluationTest, ProbesOfTheScoredRowsGiveTheRecallOfEveryRow) {
  const ModelConfig config = testing::SmallConfig();
  torch::manual_seed(3);
  DsaModel model(config);
  model->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  const int64_t t = 40;
  const auto tokens = torch::randint(config.vocab_size, {2, t}, torch::kLong);
  // Targets at a few positions of each sequence (the scored ones), -1 elsewhere.
  auto targets = torch::full({2, t}, -1, torch::kLong);
  targets.index_put_({0, torch::tensor({7, 20, 33})}, 5);
  targets.index_put_({1, torch::tensor({2, 20, 39})}, 9);
  const auto positions = torch::arange(t, torch::kLong);
  const int64_t max_rows = 8;

  ForwardOptions all;
  all.keep_probes = true;
  const auto every_row = model->forward(tokens, all);
  const IndexerRecall want = indexer_recall(every_row.probes, targets, positions, config, max_rows);

  ForwardOptions sampled = all;
  sampled.query_chunk = 16;  // the kept rows fall in different chunks
  sampled.probe_rows = recall_rows(targets, positions, config, max_rows);
  // Positions below topk see every key (recall 1 by construction) and are not scored: row 2.
  EXPECT_TRUE(torch::equal(sampled.probe_rows, torch::tensor({7, 20, 33, 39}, torch::kLong)));
  const auto some_rows = model->forward(tokens, sampled);
  ASSERT_EQ(some_rows.probes.size(), 2u);
  EXPECT_EQ(some_rows.probes[0].q.size(1), 4);
  EXPECT_EQ(some_rows.probes[0].indices.size(1), 4);
  const IndexerRecall got = indexer_recall(some_rows.probes, targets, positions, config, max_rows);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.rows, 2 * (3 + 2));  // layers x the two sequences' scored rows
  EXPECT_DOUBLE_EQ(got.total, want.total);
}

// Key sharing counts each group's selected keys over its distinct ones: selections alike share
// all (G), disjoint ones none (1); -1 slots are not keys.
TEST(EvaluationTest, KeySharingCountsSelectedOverDistinctKeys) {
  ModelConfig config = testing::SmallConfig();
  config.topk = 4;
  const int64_t t = 12;
  const auto positions = torch::arange(t, torch::kLong);
  // Rows 4..11 see more than topk keys: the window of 8 of them, from row 4.
  EXPECT_TRUE(torch::equal(sharing_rows(positions, config, 8), torch::arange(4, 12)));
  EXPECT_TRUE(torch::equal(sharing_rows(positions, config, 4), torch::arange(8, 12)));
  // A context-parallel shard whose positions jump: only the consecutive tail counts.
  EXPECT_TRUE(torch::equal(sharing_rows(torch::tensor({4, 5, 9, 10, 11}, torch::kLong), config, 8),
                           torch::tensor({2, 3, 4}, torch::kLong)));

  LayerProbe probe;
  probe.rows = torch::arange(t, torch::kLong);
  // Rows 8..11 select {0, 1, 2, 3}; rows 4..7 each their own keys, row 7 with a -1 slot.
  auto indices = torch::zeros({1, t, 4}, torch::kLong);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t s = 0; s < 4; ++s) indices[0][r][s] = r >= 8 ? s : 4 * r + s;
  }
  indices[0][7][3] = -1;
  probe.indices = indices;
  const KeySharing shared = key_sharing({probe}, positions, config, 8);
  ASSERT_EQ(shared.groups, (std::vector<int64_t>{2, 4, 8}));
  // G = 2: rows {4,5} 8/8, {6,7} 7/7, {8,9} 8/4, {10,11} 8/4.
  EXPECT_DOUBLE_EQ(shared.selected[0], 31);
  EXPECT_DOUBLE_EQ(shared.distinct[0], 23);
  // G = 4: rows 4..7 15/15, rows 8..11 16/4; G = 8: 31 over 15 + 4.
  EXPECT_DOUBLE_EQ(shared.ratio(1), 31.0 / 19.0);
  EXPECT_DOUBLE_EQ(shared.ratio(2), 31.0 / 19.0);
  // Two layers add their counts.
  const KeySharing twice = key_sharing({probe, probe}, positions, config, 8);
  EXPECT_DOUBLE_EQ(twice.selected[2], 62);
  EXPECT_DOUBLE_EQ(twice.ratio(2), shared.ratio(2));
  // A window with rows the probes lack is a bug.
  LayerProbe partial = probe;
  partial.rows = torch::arange(6, torch::kLong);
  partial.indices = indices.narrow(1, 0, 6);
  EXPECT_THROW(key_sharing({partial}, positions, config, 8), c10::Error);
}

}  // namespace
}  // namespace hyscale::trainer
