// Job specs: JSON and YAML read alike; every rejection names the field (or file, or line).
#include "proto/job_spec.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

namespace hyscale {
namespace {

using ::testing::HasSubstr;

// The recall demo: a dense indexer warm-up, then sparse training.
constexpr char kRecallYaml[] = R"(
name: recall-demo
seed: 7
model:
  vocab_size: 256
  d_model: 64
  layers: 2
  heads: 4
  head_dim_qk: 32
  rope_dim: 16
  head_dim_v: 32
  d_ff: 128
  indexer: {heads: 4, dim: 32, rope_dim: 16, topk: 64, fp8_scores: true}
data:
  seq_len: 256
  batch_size: 8
  recall: {pairs: 16, queries: 8, key_vocab: 64, value_vocab: 64}
stages:
  - name: warmup
    steps: 100
    lr: 1e-3
    attention: DENSE
    trains: INDEXER_ONLY
    indexer_loss_weight: 1
  - name: sparse
    steps: 400
    lr: 3e-4
    min_lr: 3e-5
    warmup_steps: 20
    attention: SPARSE
    indexer_loss_weight: 0.01
optimizer: {weight_decay: 0.1, grad_clip: 1.0}
recompute: {enabled: true, selection_replay: true}
checkpoint: {dir: /tmp/ckpt, every_steps: 100}
log_every: 5
)";

constexpr char kRecallJson[] = R"({
  "name": "recall-demo", "seed": 7,
  "model": {"vocab_size": 256, "d_model": 64, "layers": 2, "heads": 4, "head_dim_qk": 32,
            "rope_dim": 16, "head_dim_v": 32, "d_ff": 128,
            "indexer": {"heads": 4, "dim": 32, "rope_dim": 16, "topk": 64, "fp8_scores": true}},
  "data": {"seq_len": 256, "batch_size": 8,
           "recall": {"pairs": 16, "queries": 8, "key_vocab": 64, "value_vocab": 64}},
  "stages": [
    {"name": "warmup", "steps": 100, "lr": 0.001, "attention": "DENSE",
     "trains": "INDEXER_ONLY", "indexer_loss_weight": 1},
    {"name": "sparse", "steps": 400, "lr": 0.0003, "min_lr": 0.00003, "warmup_steps": 20,
     "attention": "SPARSE", "indexer_loss_weight": 0.01}],
  "optimizer": {"weight_decay": 0.1, "grad_clip": 1.0},
  "recompute": {"enabled": true, "selection_replay": true},
  "checkpoint": {"dir": "/tmp/ckpt", "every_steps": 100},
  "log_every": 5
})";

v1::JobSpec recall_spec() {
  auto spec = ParseJobSpec(kRecallYaml, SpecFormat::kYaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// The validation message for the demo spec after `edit`.
std::string problems_after(const std::function<void(v1::JobSpec&)>& edit) {
  v1::JobSpec spec = recall_spec();
  edit(spec);
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  return std::string(status.message());
}

std::string parse_error(const std::string& text, SpecFormat format) {
  auto spec = ParseJobSpec(text, format);
  EXPECT_TRUE(absl::IsInvalidArgument(spec.status())) << spec.status();
  return std::string(spec.status().message());
}

// A file under the test's temporary directory, removed at the end of the test.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_((std::filesystem::path(::testing::TempDir()) / name).string()) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ParseJobSpec, JsonAndYamlReadAlike) {
  auto json = ParseJobSpec(kRecallJson, SpecFormat::kJson);
  ASSERT_TRUE(json.ok()) << json.status();
  const v1::JobSpec yaml = recall_spec();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*json, yaml))
      << json->ShortDebugString() << "\nvs\n"
      << yaml.ShortDebugString();
  EXPECT_EQ(yaml.stages(1).attention(), v1::SPARSE);
  EXPECT_FLOAT_EQ(yaml.stages(0).lr(), 1e-3f);
  EXPECT_TRUE(yaml.recompute().selection_replay());
  EXPECT_TRUE(yaml.model().indexer().fp8_scores());
  EXPECT_TRUE(ValidateJobSpec(yaml).ok()) << ValidateJobSpec(yaml);
}

TEST(ParseJobSpec, YamlQuotedScalarsStayStrings) {
  auto spec = ParseJobSpec("name: '123'\ncheckpoint: {dir: \"true\"}\n", SpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "123");
  EXPECT_EQ(spec->checkpoint().dir(), "true");
}

TEST(ParseJobSpec, YamlPlainScalarsAreTyped) {
  auto spec = ParseJobSpec(
      "seed: 18446744073709551615\nrecompute: {enabled: True}\n"
      "optimizer: {eps: 1.5e-7}\nmodel: ~\n",
      SpecFormat::kYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seed(), 18446744073709551615ull);
  EXPECT_TRUE(spec->recompute().enabled());
  EXPECT_FLOAT_EQ(spec->optimizer().eps(), 1.5e-7f);
  EXPECT_FALSE(spec->has_model());
}

TEST(ParseJobSpec, UnknownFieldIsNamed) {
  EXPECT_THAT(parse_error(R"({"model": {"vocab_sze": 3}})", SpecFormat::kJson),
              HasSubstr("vocab_sze"));
  EXPECT_THAT(parse_error("data:\n  recall: {pairs: 4, keys: 9}\n", SpecFormat::kYaml),
              HasSubstr("keys"));
}

TEST(ParseJobSpec, WrongTypeNamesTheField) {
  EXPECT_THAT(parse_error("data: {seq_len: long}\n", SpecFormat::kYaml), HasSubstr("data.seq_len"));
  EXPECT_THAT(parse_error(R"({"stages": [{}, {"attention": "DENS"}]})", SpecFormat::kJson),
              HasSubstr("stages[1].attention"));
  EXPECT_THAT(parse_error(R"({"model": {"layers": 2.5}})", SpecFormat::kJson),
              HasSubstr("model.layers"));
}

TEST(ParseJobSpec, YamlSyntaxErrorHasLineAndColumn) {
  EXPECT_THAT(parse_error("name: x\nmodel:\n  d_model: [1, 2\n", SpecFormat::kYaml),
              HasSubstr("line 4"));
  EXPECT_THAT(parse_error("name: x\nmodel: {d_model: 1}\n  layers: 2\n", SpecFormat::kYaml),
              HasSubstr("column"));
}

TEST(ParseJobSpec, YamlDuplicateKeyIsAnError) {
  const std::string message = parse_error("data:\n  seq_len: 1\n  seq_len: 2\n", SpecFormat::kYaml);
  EXPECT_THAT(message, HasSubstr("duplicate key 'seq_len'"));
  EXPECT_THAT(message, HasSubstr("line 3"));
}

// Found by tests/fuzz: a Latin-1 byte used to escape as an exception and abort the process.
TEST(ParseJobSpec, YamlThatIsNotUtf8IsAnError) {
  EXPECT_THAT(parse_error("name: caf\xe9\n", SpecFormat::kYaml), HasSubstr("UTF-8"));
  EXPECT_THAT(parse_error("model:\n  \xa0 d_model: 1\n", SpecFormat::kYaml), HasSubstr("UTF-8"));
}

// "Billion laughs": nine levels of nine aliases each expand to 9^9 nodes; the cap stops it early.
TEST(ParseJobSpec, YamlAliasExpansionIsCapped) {
  std::string yaml = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int level = 1; level <= 8; ++level) {
    const std::string prev = "*a" + std::to_string(level - 1);
    yaml += "a" + std::to_string(level) + ": &a" + std::to_string(level) + " [" + prev;
    for (int i = 1; i < 9; ++i) yaml += ", " + prev;
    yaml += "]\n";
  }
  EXPECT_THAT(parse_error(yaml, SpecFormat::kYaml), HasSubstr("nodes once aliases are expanded"));
}

TEST(ParseJobSpec, EmptyYamlIsAnError) {
  EXPECT_THAT(parse_error("# nothing\n", SpecFormat::kYaml), HasSubstr("empty"));
}

TEST(LoadJobSpec, FormatFollowsTheExtension) {
  const TempFile yaml("spec.yml", kRecallYaml), json("spec.json", kRecallJson);
  auto from_yaml = LoadJobSpec(yaml.path());
  auto from_json = LoadJobSpec(json.path());
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*from_yaml, *from_json));
}

TEST(LoadJobSpec, ErrorsNameTheFile) {
  const TempFile text("spec.txt", kRecallYaml);
  EXPECT_THAT(std::string(LoadJobSpec(text.path()).status().message()),
              HasSubstr(text.path() + ": job spec must end in"));

  const std::string missing = ::testing::TempDir() + "/no-such-spec.yaml";
  const absl::Status status = LoadJobSpec(missing).status();
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(missing));

  const TempFile bad("bad.json", R"({"model": {"vocab_sze": 3}})");
  EXPECT_THAT(std::string(LoadJobSpec(bad.path()).status().message()),
              HasSubstr(bad.path() + ": job spec: "));
}

// Every spec under examples/ (the README's and the scripts' jobs) reads and validates.
TEST(LoadJobSpec, EveryExampleIsValid) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(HYSCALE_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    ++seen;
    const auto spec = LoadJobSpec(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << entry.path() << ": " << ValidateJobSpec(*spec);
  }
  EXPECT_GE(seen, 1) << "no examples in " << HYSCALE_EXAMPLES_DIR;
}

TEST(ApplyDefaults, FillsOnlyZeroFields) {
  v1::JobSpec spec = recall_spec();
  spec.mutable_optimizer()->set_beta2(0.99f);
  spec.mutable_stages(1)->clear_name();
  ApplyDefaults(&spec);
  EXPECT_FLOAT_EQ(spec.model().rope_theta(), 10000);
  EXPECT_FLOAT_EQ(spec.model().norm_eps(), 1e-5f);
  EXPECT_FLOAT_EQ(spec.optimizer().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(spec.optimizer().beta2(), 0.99f);
  EXPECT_FLOAT_EQ(spec.optimizer().eps(), 1e-8f);
  EXPECT_EQ(spec.checkpoint().keep(), 2);
  EXPECT_EQ(spec.log_every(), 5);
  EXPECT_EQ(spec.data().eval_batches(), 2);
  EXPECT_EQ(spec.stages(1).name(), "stage1");
  EXPECT_EQ(spec.stages(1).trains(), v1::ALL);
  EXPECT_EQ(spec.stages(0).trains(), v1::INDEXER_ONLY);
  EXPECT_FLOAT_EQ(spec.stages(0).min_lr(), 0);
  EXPECT_EQ(spec.eval_every(), 0);
  EXPECT_EQ(spec.threads(), 0);
}

TEST(ApplyDefaults, UnspecifiedAttentionIsDense) {
  v1::JobSpec spec = recall_spec();
  spec.mutable_stages(1)->clear_attention();
  ApplyDefaults(&spec);
  EXPECT_EQ(spec.stages(1).attention(), v1::DENSE);
}

TEST(ValidateJobSpec, NonPositiveSizesAreNamed) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_model()->set_d_model(0); }),
            "model.d_model: must be > 0 (got 0)");
  EXPECT_EQ(
      problems_after([](v1::JobSpec& s) { s.mutable_model()->mutable_indexer()->set_heads(-1); }),
      "model.indexer.heads: must be > 0 (got -1)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_data()->set_batch_size(0); }),
            "data.batch_size: must be > 0 (got 0)");
}

TEST(ValidateJobSpec, OversizedValuesAreRejected) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_model()->set_d_ff(1 << 21); }),
            "model.d_ff: must be <= 1048576 (got 2097152)");
  EXPECT_THAT(problems_after([](v1::JobSpec& s) { s.mutable_model()->set_vocab_size(1 << 25); }),
              HasSubstr("model.vocab_size: must be <= 16777216"));
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.set_name(std::string(5000, 'x')); }),
            "name: must be at most 4096 bytes (got 5000)");
  EXPECT_EQ(
      problems_after([](v1::JobSpec& s) { s.mutable_stages(0)->set_name(std::string(4097, 'y')); }),
      "stages[0].name: must be at most 4096 bytes (got 4097)");
}

TEST(ValidateJobSpec, QueryChunkIsACountOfQueries) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_recompute()->set_query_chunk(-1); }),
            "recompute.query_chunk: must be >= 0 (got -1)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_recompute()->set_query_chunk(1 << 25); }),
            "recompute.query_chunk: must be <= 16777216 (got 33554432)");
  v1::JobSpec spec = recall_spec();
  spec.mutable_recompute()->set_query_chunk(64);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, TopkMustFitTheSequence) {
  EXPECT_EQ(
      problems_after([](v1::JobSpec& s) { s.mutable_model()->mutable_indexer()->set_topk(4096); }),
      "model.indexer.topk: must be <= data.seq_len (got 4096 > 256)");
}

TEST(ValidateJobSpec, RopeDimsAreEvenAndFit) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_model()->set_rope_dim(7); }),
            "model.rope_dim: must be even (got 7)");
  EXPECT_EQ(problems_after(
                [](v1::JobSpec& s) { s.mutable_model()->mutable_indexer()->set_rope_dim(34); }),
            "model.indexer.rope_dim: must be <= model.indexer.dim (got 34 > 32)");
}

// A latent's values are the keys' first head_dim_v features, so RoPE (the last rope_dim) must
// leave them alone: in the sample, 32 + 16 > 32.
TEST(ValidateJobSpec, LatentKvLeavesTheValuesOutOfRope) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_model()->set_latent_kv(true); }),
            "model.head_dim_v: must be <= model.head_dim_qk - model.rope_dim with model.latent_kv "
            "(the values are the keys' first features, which RoPE must not touch; got 32 > 32 - "
            "16)");
  v1::JobSpec spec = recall_spec();
  spec.mutable_model()->set_latent_kv(true);
  spec.mutable_model()->set_head_dim_v(16);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, StagesAreChecked) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.clear_stages(); }),
            "stages: must hold at least one stage");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_stages(1)->set_steps(0); }),
            "stages[1].steps: must be > 0 (got 0); stages[1].warmup_steps: must be in [0, steps] "
            "(got 20, steps 0)");
  EXPECT_THAT(problems_after([](v1::JobSpec& s) { s.mutable_stages(0)->set_lr(0); }),
              HasSubstr("stages[0].lr: must be > 0 and finite (got 0)"));
  EXPECT_THAT(problems_after([](v1::JobSpec& s) { s.mutable_stages(1)->set_min_lr(1); }),
              HasSubstr("stages[1].min_lr: must be in [0, lr]"));
  EXPECT_THAT(
      problems_after([](v1::JobSpec& s) { s.mutable_stages(0)->set_indexer_loss_weight(0); }),
      HasSubstr("stages[0].indexer_loss_weight: must be > 0 when trains is INDEXER_ONLY"));
  EXPECT_THAT(problems_after([](v1::JobSpec& s) {
                s.mutable_stages(1)->set_lr(std::numeric_limits<float>::infinity());
              }),
              HasSubstr("stages[1].lr: must be > 0 and finite (got inf)"));
}

TEST(ValidateJobSpec, UnknownEnumNumbersAreRejected) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) {
              s.mutable_stages(0)->set_attention(static_cast<v1::AttentionMode>(7));
            }),
            "stages[0].attention: must be DENSE or SPARSE (got 7)");
}

TEST(ValidateJobSpec, ExactlyOneDataSource) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_data()->clear_source(); }),
            "data: must set one of recall, token_file or text_file");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_data()->mutable_token_file(); }),
            "data.token_file.path: must not be empty; data.token_file.dtype: must be UINT16 or "
            "UINT32 (got TOKEN_DTYPE_UNSPECIFIED)");
  EXPECT_EQ(
      problems_after([](v1::JobSpec& s) {
        s.mutable_data()->mutable_text_file()->set_path("input.txt");
        s.mutable_model()->set_vocab_size(128);
      }),
      "model.vocab_size: must be >= 256 for data.text_file, whose tokens are bytes (got 128)");
}

TEST(ValidateJobSpec, RecallMustFitVocabAndSequence) {
  EXPECT_EQ(
      problems_after([](v1::JobSpec& s) { s.mutable_data()->mutable_recall()->set_queries(17); }),
      "data.recall.queries: must be <= data.recall.pairs (got 17 > 16)");
  EXPECT_EQ(
      problems_after([](v1::JobSpec& s) { s.mutable_data()->mutable_recall()->set_key_vocab(8); }),
      "data.recall.key_vocab: must be >= data.recall.pairs, keys are distinct (got 8 < 16)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_model()->set_vocab_size(144); }),
            "model.vocab_size: must be >= 17 + data.recall.key_vocab + data.recall.value_vocab for "
            "the recall task (got 144 < 145)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) {
              s.mutable_data()->set_seq_len(48);
              s.mutable_model()->mutable_indexer()->set_topk(8);
            }),
            "data.seq_len: must be >= 2 * data.recall.pairs + 2 * data.recall.queries + 1 (got 48 "
            "< 49)");
}

TEST(ValidateJobSpec, PairTokensNeedTheirVocabAndFitShorterContexts) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) {
              s.mutable_data()->mutable_recall()->set_pair_tokens(true);
              s.mutable_model()->set_vocab_size(4240);
            }),
            "model.vocab_size: must be >= 17 + data.recall.key_vocab + data.recall.value_vocab + "
            "key_vocab * value_vocab (pair_tokens) for the recall task (got 4240 < 4241)");
  // A pair is one token, so 16 pairs and 8 queries fit in 33 tokens.
  v1::JobSpec spec = recall_spec();
  spec.mutable_data()->mutable_recall()->set_pair_tokens(true);
  spec.mutable_model()->set_vocab_size(4241);
  spec.mutable_data()->set_seq_len(33);
  spec.mutable_model()->mutable_indexer()->set_topk(8);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, StageShapesFitTheData) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_stages(0)->set_seq_len(512); }),
            "stages[0].seq_len: must be <= data.seq_len (got 512 > 256)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_stages(1)->set_batch_size(-2); }),
            "stages[1].batch_size: must be >= 0 (got -2)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_stages(0)->set_seq_len(40); }),
            "stages[0].seq_len: must be >= 2 * data.recall.pairs + 2 * data.recall.queries + 1 "
            "(got 40 < 49)");
  v1::JobSpec spec = recall_spec();
  spec.mutable_stages(0)->set_seq_len(64);
  spec.mutable_stages(0)->set_batch_size(32);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, OptimizerAndCheckpoint) {
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_optimizer()->set_beta1(1); }),
            "optimizer.beta1: must be in [0, 1) (got 1)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_optimizer()->set_eps(-1); }),
            "optimizer.eps: must be > 0 and finite (got -1)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.mutable_optimizer()->set_grad_clip(-1); }),
            "optimizer.grad_clip: must be >= 0 and finite (got -1)");
  EXPECT_EQ(problems_after([](v1::JobSpec& s) { s.set_threads(-2); }),
            "threads: must be >= 0 (got -2)");
}

TEST(ValidateJobSpec, Parallelism) {
  const auto parallelism = [](const std::string& yaml) {
    auto spec =
        ParseJobSpec(std::string(kRecallYaml) + "parallelism: " + yaml + "\n", SpecFormat::kYaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    const absl::Status status = ValidateJobSpec(*spec);
    return status.ok() ? std::string("ok") : std::string(status.message());
  };
  EXPECT_EQ(parallelism("{mode: AUTO}"), "ok");
  EXPECT_EQ(parallelism("{mode: MANUAL, context_parallel: 4, cp_layout: zigzag, query_group: 4}"),
            "ok");
  EXPECT_EQ(parallelism("{mode: AUTO, context_parallel: 2, cp_layout: round-robin}"), "ok");
  EXPECT_EQ(parallelism("{mode: MANUAL}"), "parallelism.context_parallel: must be > 0 (got 0)");
  EXPECT_EQ(parallelism("{mode: MANUAL, context_parallel: 2}"),
            "parallelism.cp_layout: must be set when context_parallel > 1 (got '')");
  EXPECT_EQ(parallelism("{mode: MANUAL, context_parallel: 2, cp_layout: ring}"),
            "parallelism.cp_layout: must be contiguous, zigzag or round-robin (got 'ring')");
  EXPECT_EQ(parallelism("{mode: AUTO, query_group: 3}"),
            "parallelism.query_group: must be 1, 2, 4, 8 or 16 (got 3)");
  EXPECT_EQ(parallelism("{context_parallel: 2}"),
            "parallelism.mode: must be MANUAL or AUTO when other parallelism fields are set");
  // 256 tokens in 2 x 256 zigzag chunks: not even.
  EXPECT_EQ(parallelism("{mode: MANUAL, context_parallel: 256, cp_layout: zigzag}"),
            "parallelism.context_parallel: must split data.seq_len 256 into 512 equal shards "
            "(got 256, zigzag)");
  auto spec = ParseJobSpec(std::string(kRecallYaml) +
                               "parallelism: {mode: MANUAL, "
                               "context_parallel: 4, cp_layout: contiguous}\n",
                           SpecFormat::kYaml);
  spec->mutable_stages(0)->set_seq_len(66);
  EXPECT_EQ(std::string(ValidateJobSpec(*spec).message()),
            "parallelism.context_parallel: must split stages[0].seq_len 66 into 4 equal shards "
            "(got 4)");
  EXPECT_EQ(parallelism("{mode: MANUAL, context_parallel: 2048, cp_layout: zigzag}"),
            "parallelism.context_parallel: must be <= 1024 (got 2048)");
  EXPECT_NE(
      parse_error(std::string(kRecallYaml) + "parallelism: {mode: SOMETIMES}\n", SpecFormat::kYaml)
          .find("mode"),
      std::string::npos);
}

TEST(ValidateJobSpec, ReportsEveryProblem) {
  const std::string message = problems_after([](v1::JobSpec& s) {
    s.mutable_model()->set_layers(0);
    s.mutable_stages(0)->set_steps(-1);
  });
  EXPECT_EQ(message,
            "model.layers: must be > 0 (got 0); stages[0].steps: must be > 0 (got -1); "
            "stages[0].warmup_steps: must be in [0, steps] (got 0, steps -1)");
}

TEST(RecallVocab, LayoutFollowsTheSpec) {
  const RecallVocab vocab = RecallVocab::Of(recall_spec().data().recall());
  EXPECT_EQ(RecallVocab::kQueryMarker, 16);
  EXPECT_EQ(vocab.first_key, 17);
  EXPECT_EQ(vocab.first_value, 17 + 64);
  EXPECT_EQ(vocab.size(), 17 + 64 + 64);
  EXPECT_TRUE(vocab.IsKey(17));
  EXPECT_FALSE(vocab.IsKey(81));
  EXPECT_TRUE(vocab.IsValue(81));
  EXPECT_FALSE(vocab.IsValue(145));
}

}  // namespace
}  // namespace hyscale
