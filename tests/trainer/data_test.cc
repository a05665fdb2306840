// Data sources: batches are a pure function of (seed, split, index); recall sequences follow the
// documented layout; token files window correctly and every file error names the file.
#include "worker/trainer/data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "proto/job_spec.h"
#include "tests/trainer/test_files.h"

namespace hyscale::trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSeqLen = 64;

v1::JobSpec base_spec() {
  v1::JobSpec spec;
  spec.set_seed(11);
  v1::ModelSpec* m = spec.mutable_model();
  m->set_vocab_size(4096);
  m->set_d_model(16);
  m->set_layers(1);
  m->set_heads(2);
  m->set_head_dim_qk(8);
  m->set_rope_dim(4);
  m->set_head_dim_v(8);
  m->set_d_ff(32);
  m->mutable_indexer()->set_heads(2);
  m->mutable_indexer()->set_dim(8);
  m->mutable_indexer()->set_topk(8);
  spec.mutable_data()->set_seq_len(kSeqLen);
  spec.mutable_data()->set_batch_size(4);
  v1::StageSpec* stage = spec.add_stages();
  stage->set_steps(10);
  stage->set_lr(1e-3f);
  return spec;
}

v1::JobSpec recall_spec(int pairs = 12, int queries = 6) {
  v1::JobSpec spec = base_spec();
  v1::RecallData* r = spec.mutable_data()->mutable_recall();
  r->set_pairs(pairs);
  r->set_queries(queries);
  r->set_key_vocab(40);
  r->set_value_vocab(20);
  return spec;
}

std::unique_ptr<DataSource> make(const v1::JobSpec& spec) {
  auto source = MakeDataSource(spec);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? std::move(*source) : nullptr;
}

bool same(const Batch& a, const Batch& b) {
  return a.inputs == b.inputs && a.targets == b.targets;
}

TEST(RecallData, BatchIsAFunctionOfSeedSplitAndIndex) {
  const auto source = make(recall_spec());
  const auto again = make(recall_spec());
  EXPECT_TRUE(same(source->Get(Split::kTrain, 5), again->Get(Split::kTrain, 5)));
  EXPECT_FALSE(same(source->Get(Split::kTrain, 5), source->Get(Split::kTrain, 6)));
  EXPECT_FALSE(same(source->Get(Split::kTrain, 5), source->Get(Split::kEval, 5)));

  v1::JobSpec reseeded = recall_spec();
  reseeded.set_seed(12);
  EXPECT_FALSE(same(source->Get(Split::kTrain, 5), make(reseeded)->Get(Split::kTrain, 5)));
}

// Every query key appears exactly once in the context, followed by the value the target asks
// for; everything else in the context is filler.
TEST(RecallData, SequencesFollowTheLayout) {
  const v1::JobSpec spec = recall_spec();
  const RecallVocab vocab = RecallVocab::Of(spec.data().recall());
  const int pairs = spec.data().recall().pairs(), queries = spec.data().recall().queries();
  const int context = kSeqLen - 2 * queries - 1;
  const auto source = make(spec);
  for (int64_t index = 0; index < 20; ++index) {
    const Batch batch = source->Get(index % 2 ? Split::kEval : Split::kTrain, index);
    ASSERT_EQ(batch.batch_size, 4);
    ASSERT_EQ(batch.seq_len, kSeqLen);
    for (int row = 0; row < batch.batch_size; ++row) {
      const int32_t* tokens = batch.inputs.data() + row * kSeqLen;
      const int32_t* targets = batch.targets.data() + row * kSeqLen;
      EXPECT_EQ(tokens[context], RecallVocab::kQueryMarker);

      int keys_in_context = 0;
      for (int i = 0; i < context; ++i) {
        EXPECT_EQ(targets[i], -1);
        if (vocab.IsKey(tokens[i])) {
          ++keys_in_context;
          ASSERT_LT(i + 1, context);
          EXPECT_TRUE(vocab.IsValue(tokens[i + 1]));
          ++i;
        } else {
          EXPECT_LT(tokens[i], RecallVocab::kFillerCount) << "at " << i;
        }
      }
      EXPECT_EQ(keys_in_context, pairs);

      std::set<int32_t> asked;
      for (int q = 0; q < queries; ++q) {
        const int at = context + 1 + 2 * q;
        const int32_t key = tokens[at];
        ASSERT_TRUE(vocab.IsKey(key));
        EXPECT_TRUE(asked.insert(key).second) << "key asked twice";
        EXPECT_EQ(targets[at], tokens[at + 1]);
        EXPECT_EQ(targets[at + 1], -1);
        int seen = 0;
        for (int i = 0; i < context; ++i) {
          if (tokens[i] != key) continue;
          ++seen;
          EXPECT_EQ(tokens[i + 1], targets[at])
              << "the context pairs key " << key << " with another value";
        }
        EXPECT_EQ(seen, 1) << "key " << key;
      }
    }
  }
}

// Pairs land anywhere in the context: early and late, at even and odd offsets.
TEST(RecallData, PairsSpreadOverTheWholeContext) {
  const v1::JobSpec spec = recall_spec(/*pairs=*/2, /*queries=*/1);
  const RecallVocab vocab = RecallVocab::Of(spec.data().recall());
  const int context = kSeqLen - 2 - 1;
  const auto source = make(spec);
  std::set<int> positions;
  for (int64_t index = 0; index < 50; ++index) {
    const Batch batch = source->Get(Split::kTrain, index);
    for (int i = 0; i < batch.batch_size * kSeqLen; ++i) {
      if (i % kSeqLen < context && vocab.IsKey(batch.inputs[i])) positions.insert(i % kSeqLen);
    }
  }
  EXPECT_EQ(*positions.begin(), 0);
  EXPECT_EQ(*positions.rbegin(), context - 2);
  EXPECT_GT(positions.size(), static_cast<size_t>(context) * 3 / 4);
}

// With pair_tokens each context pair is one token naming its key and value; queries are still
// "key value" with the value as the target.
TEST(RecallData, PairTokensHoldKeyAndValue) {
  v1::JobSpec spec = recall_spec();
  spec.mutable_data()->mutable_recall()->set_pair_tokens(true);
  const RecallVocab vocab = RecallVocab::Of(spec.data().recall());
  ASSERT_EQ(vocab.pair_count, 40 * 20);
  const int pairs = spec.data().recall().pairs(), queries = spec.data().recall().queries();
  const int context = kSeqLen - 2 * queries - 1;
  const auto source = make(spec);
  for (int64_t index = 0; index < 20; ++index) {
    const Batch batch = source->Get(Split::kTrain, index);
    for (int row = 0; row < batch.batch_size; ++row) {
      const int32_t* tokens = batch.inputs.data() + row * kSeqLen;
      const int32_t* targets = batch.targets.data() + row * kSeqLen;
      int pairs_in_context = 0;
      for (int i = 0; i < context; ++i) {
        EXPECT_TRUE(vocab.IsPair(tokens[i]) || tokens[i] < RecallVocab::kFillerCount) << i;
        pairs_in_context += vocab.IsPair(tokens[i]);
      }
      EXPECT_EQ(pairs_in_context, pairs);
      for (int q = 0; q < queries; ++q) {
        const int at = context + 1 + 2 * q;
        ASSERT_TRUE(vocab.IsKey(tokens[at]));
        ASSERT_TRUE(vocab.IsValue(targets[at]));
        const int32_t pair = static_cast<int32_t>(vocab.Pair(tokens[at], targets[at]));
        EXPECT_EQ(std::count(tokens, tokens + context, pair), 1) << "query " << q;
      }
    }
  }
}

// A stage may train on a shorter context or another batch size (a length curriculum); the
// layout holds at every length.
TEST(RecallData, ShapeCanDifferFromTheDataSpec) {
  const v1::JobSpec spec = recall_spec(/*pairs=*/4, /*queries=*/2);
  const auto source = make(spec);
  const Batch batch = source->Get(Split::kTrain, 3, BatchShape{7, 16});
  ASSERT_EQ(batch.batch_size, 7);
  ASSERT_EQ(batch.seq_len, 16);
  ASSERT_EQ(batch.inputs.size(), 7u * 16u);
  for (int row = 0; row < 7; ++row) {
    EXPECT_EQ(batch.inputs[row * 16 + 16 - 2 * 2 - 1], RecallVocab::kQueryMarker);
  }
  EXPECT_TRUE(same(batch, source->Get(Split::kTrain, 3, BatchShape{7, 16})));
  EXPECT_EQ(source->Get(Split::kTrain, 3).seq_len, kSeqLen);
}

TEST(ScoreQueries, CountsOnlyPositionsWithATarget) {
  auto accuracy = ScoreQueries({5, 7, 9, 1}, {5, -1, 8, 1});
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  EXPECT_EQ(accuracy->correct, 2);
  EXPECT_EQ(accuracy->counted, 3);
  EXPECT_DOUBLE_EQ(accuracy->value(), 2.0 / 3);
  EXPECT_TRUE(absl::IsInvalidArgument(ScoreQueries({1}, {1, 2}).status()));
}

TEST(MakeDataSource, RejectsAnInvalidSpec) {
  v1::JobSpec spec = recall_spec();
  spec.mutable_data()->mutable_recall()->set_queries(0);
  const absl::Status status = MakeDataSource(spec).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("data.recall.queries"));
}

// Little-endian tokens 0, 1, 2, ... of `width` bytes.
std::string counting_tokens(int64_t count, int width) {
  std::string bytes;
  for (int64_t i = 0; i < count; ++i) {
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((i >> (8 * b)) & 0xff));
  }
  return bytes;
}

v1::JobSpec token_file_spec(const std::string& path, v1::TokenDtype dtype) {
  v1::JobSpec spec = base_spec();
  spec.mutable_data()->mutable_token_file()->set_path(path);
  spec.mutable_data()->mutable_token_file()->set_dtype(dtype);
  return spec;
}

// With token i = i, a window's content tells where it came from.
TEST(TokenFileData, WindowsComeFromTheirSplit) {
  const ScratchDir dir;
  constexpr int64_t kTokens = 2000;  // eval = the last 200
  const auto source =
      make(token_file_spec(dir.Write("tokens.bin", counting_tokens(kTokens, 2)), v1::UINT16));
  bool train_seen_late_start = false;
  for (int64_t index = 0; index < 30; ++index) {
    for (Split split : {Split::kTrain, Split::kEval}) {
      const Batch batch = source->Get(split, index);
      for (int row = 0; row < batch.batch_size; ++row) {
        const int32_t* inputs = batch.inputs.data() + row * kSeqLen;
        const int32_t* targets = batch.targets.data() + row * kSeqLen;
        for (int t = 0; t < kSeqLen; ++t) {
          ASSERT_EQ(inputs[t], inputs[0] + t);
          ASSERT_EQ(targets[t], inputs[t] + 1);
        }
        if (split == Split::kEval) {
          EXPECT_GE(inputs[0], kTokens - 200);
          EXPECT_LT(targets[kSeqLen - 1], kTokens);
        } else {
          EXPECT_LT(targets[kSeqLen - 1], kTokens - 200);
          train_seen_late_start |= inputs[0] > kTokens / 2;
        }
      }
    }
  }
  EXPECT_TRUE(train_seen_late_start);
  EXPECT_TRUE(same(source->Get(Split::kTrain, 3), source->Get(Split::kTrain, 3)));
}

TEST(TokenFileData, ReadsUint32AndText) {
  const ScratchDir dir;
  const auto uint32 =
      make(token_file_spec(dir.Write("tokens32.bin", counting_tokens(300, 4)), v1::UINT32));
  const Batch batch = uint32->Get(Split::kTrain, 0);
  EXPECT_EQ(batch.targets[0], batch.inputs[0] + 1);

  v1::JobSpec text = base_spec();
  text.mutable_data()->mutable_text_file()->set_path(
      dir.Write("input.txt", std::string(kSeqLen + 1, 'a')));
  const Batch bytes = make(text)->Get(Split::kEval, 0);
  EXPECT_EQ(bytes.inputs[0], 'a');
  EXPECT_EQ(bytes.targets[kSeqLen - 1], 'a');
}

// Each failure names the spec field, the file and the reason.
absl::Status token_file_error(const std::string& path, v1::TokenDtype dtype,
                              int vocab_size = 4096) {
  v1::JobSpec spec = token_file_spec(path, dtype);
  spec.mutable_model()->set_vocab_size(vocab_size);
  return MakeDataSource(spec).status();
}

TEST(TokenFileData, MissingFile) {
  const ScratchDir dir;
  const std::string path = dir.Path("missing.bin");
  const absl::Status status = token_file_error(path, v1::UINT16);
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("data.token_file.path: " + path), HasSubstr("No such file")));
}

TEST(TokenFileData, ShortFile) {
  const ScratchDir dir;
  const std::string path = dir.Write("short.bin", counting_tokens(kSeqLen, 2));
  EXPECT_THAT(std::string(token_file_error(path, v1::UINT16).message()),
              AllOf(HasSubstr(path), HasSubstr("short: 64 tokens, need 65")));
  const std::string empty = dir.Write("empty.bin", "");
  EXPECT_THAT(std::string(token_file_error(empty, v1::UINT16).message()),
              AllOf(HasSubstr(empty), HasSubstr("short: 0 tokens")));
}

TEST(TokenFileData, SizeNotAMultipleOfTheTokenSize) {
  const ScratchDir dir;
  const std::string path = dir.Write("odd.bin", counting_tokens(100, 2) + "x");
  EXPECT_THAT(std::string(token_file_error(path, v1::UINT16).message()),
              AllOf(HasSubstr(path), HasSubstr("corrupt: size 201 bytes is not a multiple")));
}

TEST(TokenFileData, TokenOutsideTheVocabulary) {
  const ScratchDir dir;
  std::string bytes = counting_tokens(100, 4);
  bytes.replace(4 * 3, 4, counting_tokens(70001, 4).substr(4 * 70000));  // token 3 := 70000
  const std::string path = dir.Write("big.bin", bytes);
  EXPECT_THAT(
      std::string(token_file_error(path, v1::UINT32, 50000).message()),
      AllOf(HasSubstr(path), HasSubstr("corrupt: holds a token id >= model.vocab_size 50000"),
            Not(HasSubstr("70000"))));
}

TEST(TextFileData, MissingFileNamesTheField) {
  v1::JobSpec spec = base_spec();
  spec.mutable_data()->mutable_text_file()->set_path("/nonexistent/input.txt");
  EXPECT_THAT(std::string(MakeDataSource(spec).status().message()),
              HasSubstr("data.text_file.path: /nonexistent/input.txt: cannot open"));
}

}  // namespace
}  // namespace hyscale::trainer
