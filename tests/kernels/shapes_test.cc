// Shape validation names the offending field; the visibility rule s*m + m - 1 <= t.
#include "kernels/shapes.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace hyscale {
namespace {

void expect_rejected(const std::function<void()>& validate, const std::string& message) {
  try {
    validate();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

IndexerShape valid_indexer_shape() {
  IndexerShape s;
  s.num_queries = 3;
  s.num_keys = 4;
  s.heads = 2;
  s.dim = 5;
  return s;
}

SparseAttnShape valid_attn_shape() {
  SparseAttnShape s;
  s.num_queries = 3;
  s.num_keys = 4;
  s.heads = 2;
  s.dim_qk = 5;
  s.dim_v = 6;
  s.topk = 2;
  return s;
}

TEST(ShapesTest, IndexerShapeNamesTheBadField) {
  EXPECT_NO_THROW(valid_indexer_shape().validate());
  const std::vector<std::pair<std::function<void(IndexerShape&)>, std::string>> cases = {
      {[](IndexerShape& s) { s.num_queries = -1; },
       "IndexerShape.num_queries must be >= 0 (got -1)"},
      {[](IndexerShape& s) { s.num_keys = -2; }, "IndexerShape.num_keys must be >= 0 (got -2)"},
      {[](IndexerShape& s) { s.num_keys = int64_t{1} << 31; }, "IndexerShape.num_keys"},
      {[](IndexerShape& s) { s.heads = 0; }, "IndexerShape.heads must be > 0 (got 0)"},
      {[](IndexerShape& s) { s.dim = 0; }, "IndexerShape.dim must be > 0 (got 0)"},
      {[](IndexerShape& s) { s.q_offset = -3; }, "IndexerShape.q_offset must be >= 0 (got -3)"},
      {[](IndexerShape& s) { s.visibility.tokens_per_key = 0; },
       "IndexerShape.visibility.tokens_per_key must be > 0 (got 0)"},
  };
  for (const auto& [corrupt, message] : cases) {
    IndexerShape s = valid_indexer_shape();
    corrupt(s);
    expect_rejected([&] { s.validate(); }, message);
  }
}

TEST(ShapesTest, SparseAttnShapeNamesTheBadField) {
  EXPECT_NO_THROW(valid_attn_shape().validate());
  const std::vector<std::pair<std::function<void(SparseAttnShape&)>, std::string>> cases = {
      {[](SparseAttnShape& s) { s.num_queries = -1; }, "SparseAttnShape.num_queries must be >= 0"},
      {[](SparseAttnShape& s) { s.num_keys = -1; }, "SparseAttnShape.num_keys must be >= 0"},
      {[](SparseAttnShape& s) { s.heads = 0; }, "SparseAttnShape.heads must be > 0 (got 0)"},
      {[](SparseAttnShape& s) { s.dim_qk = 0; }, "SparseAttnShape.dim_qk must be > 0 (got 0)"},
      {[](SparseAttnShape& s) { s.dim_v = -4; }, "SparseAttnShape.dim_v must be > 0 (got -4)"},
      {[](SparseAttnShape& s) { s.topk = 0; }, "SparseAttnShape.topk must be > 0 (got 0)"},
  };
  for (const auto& [corrupt, message] : cases) {
    SparseAttnShape s = valid_attn_shape();
    corrupt(s);
    expect_rejected([&] { s.validate(); }, message);
  }
}

TEST(ShapesTest, DenseIndexerShapeNamesTheBadField) {
  DenseIndexerShape s{valid_indexer_shape(), 3, 7};
  EXPECT_NO_THROW(s.validate());
  s.indexer.dim = 0;
  expect_rejected([&] { s.validate(); }, "IndexerShape.dim must be > 0 (got 0)");
  s = {valid_indexer_shape(), 0, 7};
  expect_rejected([&] { s.validate(); }, "DenseIndexerShape.heads must be > 0 (got 0)");
  s = {valid_indexer_shape(), 3, -1};
  expect_rejected([&] { s.validate(); }, "DenseIndexerShape.dim_qk must be > 0 (got -1)");
}

TEST(ShapesTest, KeyIsVisibleOnceItsLastTokenIs) {
  const KeyVisibility one{1}, four{4};
  EXPECT_EQ(one.visible_keys(0, 10), 1);
  EXPECT_EQ(one.visible_keys(9, 10), 10);
  EXPECT_EQ(one.visible_keys(20, 10), 10);  // clipped to the keys there are
  EXPECT_EQ(four.visible_keys(2, 10), 0);   // key 0 covers tokens 0..3
  EXPECT_EQ(four.visible_keys(3, 10), 1);
  EXPECT_EQ(four.visible_keys(6, 10), 1);
  EXPECT_EQ(four.visible_keys(7, 10), 2);
  for (const KeyVisibility& v : {one, four}) {  // the first position that sees key s
    for (int64_t s = 0; s < 5; ++s) {
      EXPECT_EQ(v.visible_keys(v.first_position(s) - 1, 10), s);
      EXPECT_EQ(v.visible_keys(v.first_position(s), 10), s + 1);
    }
  }
  IndexerShape shard = valid_indexer_shape();
  shard.q_offset = 5;
  shard.visibility.tokens_per_key = 2;
  EXPECT_EQ(shard.visible_keys(0), 3);  // position 5: keys 0..2 (key 2 ends at token 5)
  EXPECT_EQ(shard.visible_keys(2), 4);  // position 7, clipped to num_keys = 4
}

}  // namespace
}  // namespace hyscale
