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

}  // namespace
}  // namespace hyscale::trainer
