#include "proto/job_spec.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "proto/constants.h"
#include "proto/cp_layout.h"

namespace hyscale {
namespace {

// Upper bounds that keep products of sizes far from overflow and allocations sane.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxBatchTokens = (int64_t{1} << 31) - 1;  // one batch's int32 ids
constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr int64_t kMaxThreads = 1 << 16;
constexpr size_t kMaxText = 4096;  // bytes of a name or a path

// ---- YAML -> JSON ----

// YAML 1.2 core-schema reading of an untagged plain scalar: number, bool, null, else string.
nlohmann::json plain_scalar(const std::string& text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (text == "null" || text == "Null" || text == "NULL" || text == "~") return nullptr;
  const auto number = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  // Out-of-range floats parse as inf, which JSON cannot carry: left as a string, protobuf's
  // parser then reports the field.
  if (number.is_number() && std::isfinite(number.get<double>())) return number;
  return text;
}

// Nodes a spec may expand to. Aliases share nodes in yaml-cpp's tree but are copied into the
// JSON, so a few lines of nested aliases ("billion laughs") would expand to gigabytes; a real spec
// has a few hundred nodes.
constexpr int64_t kMaxYamlNodes = 100'000;

// Throws YAML::ParserException (like yaml-cpp itself) so every YAML error carries a position.
// `nodes_left`: the expansion budget, shared by the whole document.
nlohmann::json yaml_to_json(const YAML::Node& node, int64_t& nodes_left) {
  if (--nodes_left < 0) {
    throw YAML::ParserException(
        node.Mark(), absl::StrCat("more than ", kMaxYamlNodes, " nodes once aliases are expanded"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      auto out = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          throw YAML::ParserException(entry.first.Mark(), "map keys must be plain names");
        }
        const std::string& key = entry.first.Scalar();
        if (out.contains(key)) {
          throw YAML::ParserException(entry.first.Mark(), "duplicate key '" + key + "'");
        }
        out[key] = yaml_to_json(entry.second, nodes_left);
      }
      return out;
    }
    case YAML::NodeType::Sequence: {
      auto out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item, nodes_left));
      return out;
    }
    case YAML::NodeType::Scalar:
      // yaml-cpp tags plain scalars "?"; quoted ones "!", explicitly tagged ones by their tag.
      return node.Tag() == "?" ? plain_scalar(node.Scalar()) : nlohmann::json(node.Scalar());
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
  }
  return nullptr;
}

absl::StatusOr<std::string> yaml_to_json_text(std::string_view text) {
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    if (root.IsNull()) return absl::InvalidArgumentError("job spec is empty");
    int64_t nodes_left = kMaxYamlNodes;
    return yaml_to_json(root, nodes_left).dump();
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return absl::InvalidArgumentError(absl::StrCat("YAML: ", e.msg));
    return absl::InvalidArgumentError(
        absl::StrCat("YAML: line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  } catch (const nlohmann::json::exception& e) {
    // yaml-cpp passes any bytes through; dump() throws on a string that is not UTF-8.
    return absl::InvalidArgumentError(absl::StrCat("YAML: text must be UTF-8 (", e.what(), ")"));
  }
}

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) text.append(buffer, n);
  if (std::ferror(file.get()))
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot read"));
  return text;
}

// ---- Validation ----

// An enum value for a message: its name, or the number when it has none.
std::string enum_text(const std::string& name, int value) {
  return name.empty() ? std::to_string(value) : name;
}

// Collects "field: rule (got value)" messages.
class Problems {
 public:
  void Add(const std::string& field, const std::string& problem) {
    messages_.push_back(absl::StrCat(field, ": ", problem));
  }

  void Positive(const std::string& field, int64_t value, int64_t max) {
    if (value <= 0) {
      Add(field, absl::StrCat("must be > 0 (got ", value, ")"));
    } else if (value > max) {
      Add(field, absl::StrCat("must be <= ", max, " (got ", value, ")"));
    }
  }

  void AtLeast(const std::string& field, int64_t value, int64_t min) {
    if (value < min) Add(field, absl::StrCat("must be >= ", min, " (got ", value, ")"));
  }

  // `value` <= another field's value, e.g. "must be <= data.seq_len (got 4096 > 1024)".
  void AtMostField(const std::string& field, int64_t value, const std::string& bound_field,
                   int64_t bound) {
    if (value > bound) {
      Add(field, absl::StrCat("must be <= ", bound_field, " (got ", value, " > ", bound, ")"));
    }
  }

  // RoPE rotates pairs of dims, so its width is even and fits the vector it rotates.
  void RopeDim(const std::string& field, int64_t value, const std::string& dim_field, int64_t dim) {
    if (value < 0) {
      AtLeast(field, value, 0);
    } else if (value % 2 != 0) {
      Add(field, absl::StrCat("must be even (got ", value, ")"));
    } else {
      AtMostField(field, value, dim_field, dim);
    }
  }

  void PositiveReal(const std::string& field, double value) {
    if (!(value > 0) || !std::isfinite(value)) {
      Add(field, absl::StrCat("must be > 0 and finite (got ", value, ")"));
    }
  }

  void NonNegativeReal(const std::string& field, double value) {
    if (!(value >= 0) || !std::isfinite(value)) {
      Add(field, absl::StrCat("must be >= 0 and finite (got ", value, ")"));
    }
  }

  // Names and paths end up in tables, metrics labels and file names: keep them reasonable.
  void ShortText(const std::string& field, const std::string& value) {
    if (value.size() > kMaxText) {
      Add(field, absl::StrCat("must be at most ", kMaxText, " bytes (got ", value.size(), ")"));
    }
  }

  // [lo, hi) for Adam's betas.
  void HalfOpen(const std::string& field, double value, double lo, double hi) {
    if (!(value >= lo && value < hi)) {
      Add(field, absl::StrCat("must be in [", lo, ", ", hi, ") (got ", value, ")"));
    }
  }

  absl::Status ToStatus() const {
    if (messages_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(messages_, "; "));
  }

 private:
  std::vector<std::string> messages_;
};

void validate_model(const v1::JobSpec& spec, Problems& p) {
  const v1::ModelSpec& m = spec.model();
  p.Positive("model.vocab_size", m.vocab_size(), kMaxVocab);
  p.Positive("model.d_model", m.d_model(), kMaxDim);
  p.Positive("model.layers", m.layers(), kMaxDim);
  p.Positive("model.heads", m.heads(), kMaxDim);
  p.Positive("model.head_dim_qk", m.head_dim_qk(), kMaxDim);
  p.Positive("model.head_dim_v", m.head_dim_v(), kMaxDim);
  p.Positive("model.d_ff", m.d_ff(), kMaxDim);
  p.RopeDim("model.rope_dim", m.rope_dim(), "model.head_dim_qk", m.head_dim_qk());
  if (m.latent_kv() && m.head_dim_v() + m.rope_dim() > m.head_dim_qk()) {
    p.Add("model.head_dim_v",
          absl::StrCat("must be <= model.head_dim_qk - model.rope_dim with model.latent_kv (the "
                       "values are the keys' first features, which RoPE must not touch; got ",
                       m.head_dim_v(), " > ", m.head_dim_qk(), " - ", m.rope_dim(), ")"));
  }
  p.PositiveReal("model.rope_theta", m.rope_theta());
  p.PositiveReal("model.norm_eps", m.norm_eps());

  const v1::IndexerSpec& ix = m.indexer();
  p.Positive("model.indexer.heads", ix.heads(), kMaxDim);
  p.Positive("model.indexer.dim", ix.dim(), kMaxDim);
  p.RopeDim("model.indexer.rope_dim", ix.rope_dim(), "model.indexer.dim", ix.dim());
  p.Positive("model.indexer.topk", ix.topk(), kMaxSeqLen);
  if (spec.data().seq_len() > 0) {
    p.AtMostField("model.indexer.topk", ix.topk(), "data.seq_len", spec.data().seq_len());
  }
}

// Every pair and query is two tokens, plus the marker between context and queries.
void validate_recall(const v1::JobSpec& spec, Problems& p) {
  const v1::RecallData& r = spec.data().recall();
  p.Positive("data.recall.pairs", r.pairs(), kMaxSeqLen);
  if (r.queries() <= 0) {
    p.Positive("data.recall.queries", r.queries(), kMaxSeqLen);
  } else {
    p.AtMostField("data.recall.queries", r.queries(), "data.recall.pairs", r.pairs());
  }
  p.Positive("data.recall.key_vocab", r.key_vocab(), kMaxVocab);
  if (r.key_vocab() > 0 && r.key_vocab() < r.pairs()) {
    p.Add("data.recall.key_vocab",
          absl::StrCat("must be >= data.recall.pairs, keys are distinct (got ", r.key_vocab(),
                       " < ", r.pairs(), ")"));
  }
  p.Positive("data.recall.value_vocab", r.value_vocab(), kMaxVocab);

  const int64_t needed = RecallVocab::Of(r).size();
  if (needed > spec.model().vocab_size()) {
    p.Add(
        "model.vocab_size",
        absl::StrCat("must be >= ", RecallVocab::kSpecialTokens,
                     " + data.recall.key_vocab + data.recall.value_vocab",
                     r.pair_tokens() ? " + key_vocab * value_vocab (pair_tokens)" : "",
                     " for the recall task (got ", spec.model().vocab_size(), " < ", needed, ")"));
  }
  // Every stage's context must hold the pairs, the marker and the queries.
  const int64_t tokens =
      (r.pair_tokens() ? 1 : 2) * int64_t{r.pairs()} + 2 * int64_t{r.queries()} + 1;
  const char* rule = r.pair_tokens() ? "data.recall.pairs + 2 * data.recall.queries + 1"
                                     : "2 * data.recall.pairs + 2 * data.recall.queries + 1";
  auto check_context = [&](const std::string& field, int64_t seq_len) {
    if (seq_len > 0 && tokens > seq_len) {
      p.Add(field, absl::StrCat("must be >= ", rule, " (got ", seq_len, " < ", tokens, ")"));
    }
  };
  check_context("data.seq_len", spec.data().seq_len());
  for (int i = 0; i < spec.stages_size(); ++i) {
    check_context(absl::StrCat("stages[", i, "].seq_len"), spec.stages(i).seq_len());
  }
}

void validate_data(const v1::JobSpec& spec, Problems& p) {
  const v1::DataSpec& d = spec.data();
  p.Positive("data.seq_len", d.seq_len(), kMaxSeqLen);
  p.Positive("data.batch_size", d.batch_size(), kMaxDim);
  if (int64_t{d.seq_len()} * d.batch_size() > kMaxBatchTokens) {
    p.Add("data.batch_size", absl::StrCat("times data.seq_len must be <= ", kMaxBatchTokens,
                                          " (got ", d.batch_size(), " * ", d.seq_len(), ")"));
  }
  p.AtLeast("data.eval_batches", d.eval_batches(), 1);
  switch (d.source_case()) {
    case v1::DataSpec::kRecall:
      validate_recall(spec, p);
      break;
    case v1::DataSpec::kTokenFile:
      if (d.token_file().path().empty()) p.Add("data.token_file.path", "must not be empty");
      p.ShortText("data.token_file.path", d.token_file().path());
      if (d.token_file().dtype() != v1::UINT16 && d.token_file().dtype() != v1::UINT32) {
        p.Add("data.token_file.dtype",
              absl::StrCat(
                  "must be UINT16 or UINT32 (got ",
                  enum_text(v1::TokenDtype_Name(d.token_file().dtype()), d.token_file().dtype()),
                  ")"));
      }
      break;
    case v1::DataSpec::kTextFile:
      if (d.text_file().path().empty()) p.Add("data.text_file.path", "must not be empty");
      p.ShortText("data.text_file.path", d.text_file().path());
      if (spec.model().vocab_size() < 256) {
        p.Add("model.vocab_size", absl::StrCat("must be >= 256 for data.text_file, whose tokens "
                                               "are bytes (got ",
                                               spec.model().vocab_size(), ")"));
      }
      break;
    case v1::DataSpec::SOURCE_NOT_SET:
      p.Add("data", "must set one of recall, token_file or text_file");
      break;
  }
}

void validate_stage(const v1::StageSpec& s, const v1::DataSpec& data, const std::string& f,
                    Problems& p) {
  p.ShortText(f + ".name", s.name());
  p.Positive(f + ".steps", s.steps(), kMaxSteps);
  p.PositiveReal(f + ".lr", s.lr());
  if (!(s.min_lr() >= 0 && s.min_lr() <= s.lr())) {
    p.Add(f + ".min_lr",
          absl::StrCat("must be in [0, lr] (got ", s.min_lr(), ", lr ", s.lr(), ")"));
  }
  if (s.warmup_steps() < 0 || s.warmup_steps() > s.steps()) {
    p.Add(f + ".warmup_steps", absl::StrCat("must be in [0, steps] (got ", s.warmup_steps(),
                                            ", steps ", s.steps(), ")"));
  }
  if (s.attention() != v1::DENSE && s.attention() != v1::SPARSE) {
    p.Add(f + ".attention",
          absl::StrCat("must be DENSE or SPARSE (got ",
                       enum_text(v1::AttentionMode_Name(s.attention()), s.attention()), ")"));
  }
  if (s.trains() != v1::ALL && s.trains() != v1::INDEXER_ONLY) {
    p.Add(f + ".trains", absl::StrCat("must be ALL or INDEXER_ONLY (got ",
                                      enum_text(v1::Trainable_Name(s.trains()), s.trains()), ")"));
  }
  p.NonNegativeReal(f + ".indexer_loss_weight", s.indexer_loss_weight());
  // 0 takes the data's value.
  p.AtLeast(f + ".seq_len", s.seq_len(), 0);
  p.AtMostField(f + ".seq_len", s.seq_len(), "data.seq_len", data.seq_len());
  p.AtLeast(f + ".batch_size", s.batch_size(), 0);
  if (s.batch_size() > kMaxDim) p.Positive(f + ".batch_size", s.batch_size(), kMaxDim);
  const int64_t seq_len = s.seq_len() > 0 ? s.seq_len() : data.seq_len();
  const int64_t batch_size = s.batch_size() > 0 ? s.batch_size() : data.batch_size();
  if (seq_len * batch_size > kMaxBatchTokens) {
    p.Add(f + ".batch_size", absl::StrCat("times the stage's seq_len must be <= ", kMaxBatchTokens,
                                          " (got ", batch_size, " * ", seq_len, ")"));
  }
  if (s.trains() == v1::INDEXER_ONLY && s.indexer_loss_weight() == 0) {
    p.Add(f + ".indexer_loss_weight",
          "must be > 0 when trains is INDEXER_ONLY (nothing would "
          "learn) (got 0)");
  }
}

void validate_stages(const v1::JobSpec& spec, Problems& p) {
  if (spec.stages().empty()) p.Add("stages", "must hold at least one stage");
  for (int i = 0; i < spec.stages_size(); ++i) {
    validate_stage(spec.stages(i), spec.data(), absl::StrCat("stages[", i, "]"), p);
  }
}

void validate_training(const v1::JobSpec& spec, Problems& p) {
  const v1::OptimizerSpec& o = spec.optimizer();
  p.HalfOpen("optimizer.beta1", o.beta1(), 0, 1);
  p.HalfOpen("optimizer.beta2", o.beta2(), 0, 1);
  p.PositiveReal("optimizer.eps", o.eps());
  p.NonNegativeReal("optimizer.grad_clip", o.grad_clip());
  p.NonNegativeReal("optimizer.weight_decay", o.weight_decay());

  const v1::CheckpointSpec& c = spec.checkpoint();
  p.ShortText("name", spec.name());
  p.ShortText("checkpoint.dir", c.dir());
  p.AtLeast("checkpoint.every_steps", c.every_steps(), 0);
  p.AtLeast("checkpoint.keep", c.keep(), 1);
  p.AtLeast("log_every", spec.log_every(), 1);
  p.AtLeast("eval_every", spec.eval_every(), 0);
  p.AtLeast("recompute.query_chunk", spec.recompute().query_chunk(), 0);
  if (spec.recompute().query_chunk() > kMaxSeqLen) {
    p.Add("recompute.query_chunk",
          absl::StrCat("must be <= ", kMaxSeqLen, " (got ", spec.recompute().query_chunk(), ")"));
  }
  p.AtLeast("threads", spec.threads(), 0);
  if (spec.threads() > kMaxThreads) {
    p.Add("threads", absl::StrCat("must be <= ", kMaxThreads, " (got ", spec.threads(), ")"));
  }
}

// Context parallelism: with MANUAL the degree and layout must be given; with AUTO they may be
// left for the planner. Either way what is set must be runnable: the sequence splits evenly.
void validate_parallelism(const v1::JobSpec& spec, Problems& p) {
  const v1::ParallelismSpec& par = spec.parallelism();
  if (!v1::ParallelismMode_IsValid(par.mode())) {
    p.Add("parallelism.mode", absl::StrCat("must be MANUAL or AUTO (got ", par.mode(), ")"));
    return;
  }
  const bool manual = par.mode() == v1::MANUAL;
  if (par.mode() == v1::PARALLELISM_MODE_UNSPECIFIED &&
      (par.context_parallel() != 0 || !par.cp_layout().empty() || par.query_group() != 0 ||
       par.separate_indexer_group())) {
    p.Add("parallelism.mode", "must be MANUAL or AUTO when other parallelism fields are set");
  }
  if (manual || par.context_parallel() != 0) {
    p.Positive("parallelism.context_parallel", par.context_parallel(), kMaxRanks);
  }
  const std::string& layout = par.cp_layout();
  const auto parsed_layout = ParseCpLayout(layout);
  if (!layout.empty() && !parsed_layout.ok()) {
    p.Add("parallelism.cp_layout", std::string(parsed_layout.status().message()));
  }
  if (manual && par.context_parallel() > 1 && layout.empty()) {
    p.Add("parallelism.cp_layout", "must be set when context_parallel > 1 (got '')");
  }
  const int g = par.query_group();
  if (g != 0 && !IsQueryGroup(g)) {
    p.Add("parallelism.query_group", absl::StrCat("must be ", kQueryGroupsText, " (got ", g, ")"));
  }
  const int64_t cp = par.context_parallel();
  if (cp <= 0 || cp > kMaxRanks) return;
  const bool zigzag = parsed_layout.ok() && *parsed_layout == v1::CP_LAYOUT_ZIGZAG;
  const int64_t shards = CpShards(parsed_layout.value_or(v1::CP_LAYOUT_CONTIGUOUS), cp);
  const auto check = [&](const std::string& field, int64_t seq_len) {
    if (seq_len % shards == 0) return;
    p.Add("parallelism.context_parallel",
          absl::StrCat("must split ", field, " ", seq_len, " into ", shards, " equal shards (got ",
                       cp, zigzag ? ", zigzag)" : ")"));
  };
  check("data.seq_len", spec.data().seq_len());  // evaluation runs at the data's length
  for (int i = 0; i < spec.stages_size(); ++i) {
    if (spec.stages(i).seq_len() > 0) {
      check(absl::StrCat("stages[", i, "].seq_len"), spec.stages(i).seq_len());
    }
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(std::string_view text, SpecFormat format) {
  std::string json(text);
  if (format == SpecFormat::kYaml) {
    auto converted = yaml_to_json_text(text);
    if (!converted.ok()) return converted.status();
    json = std::move(*converted);
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  v1::JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    // protobuf names the field path, e.g. "(model) vocab_sze: Cannot find field."
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path) {
  SpecFormat format;
  if (absl::EndsWithIgnoreCase(path, ".json")) {
    format = SpecFormat::kJson;
  } else if (absl::EndsWithIgnoreCase(path, ".yaml") || absl::EndsWithIgnoreCase(path, ".yml")) {
    format = SpecFormat::kYaml;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": job spec must end in .json, .yaml or .yml"));
  }
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  auto spec = ParseJobSpec(*text, format);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

std::string RecomputeName(const v1::RecomputeSpec& recompute) {
  if (!recompute.enabled()) return "no recomputation";
  return recompute.selection_replay() ? "recomputation with replay"
                                      : "recomputation with re-selection";
}

void ApplyDefaults(v1::JobSpec* spec) {
  v1::ModelSpec* m = spec->mutable_model();
  if (m->rope_theta() == 0) m->set_rope_theta(10000);
  if (m->norm_eps() == 0) m->set_norm_eps(1e-5f);
  v1::OptimizerSpec* o = spec->mutable_optimizer();
  if (o->beta1() == 0) o->set_beta1(0.9f);
  if (o->beta2() == 0) o->set_beta2(0.95f);
  if (o->eps() == 0) o->set_eps(1e-8f);
  if (spec->checkpoint().keep() == 0) spec->mutable_checkpoint()->set_keep(2);
  if (spec->log_every() == 0) spec->set_log_every(10);
  if (spec->data().eval_batches() == 0) spec->mutable_data()->set_eval_batches(2);
  for (int i = 0; i < spec->stages_size(); ++i) {
    v1::StageSpec* stage = spec->mutable_stages(i);
    if (stage->name().empty()) stage->set_name(absl::StrCat("stage", i));
    if (stage->attention() == v1::ATTENTION_MODE_UNSPECIFIED) stage->set_attention(v1::DENSE);
    if (stage->trains() == v1::TRAINABLE_UNSPECIFIED) stage->set_trains(v1::ALL);
  }
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec effective = spec;
  ApplyDefaults(&effective);
  Problems p;
  validate_model(effective, p);
  validate_data(effective, p);
  validate_stages(effective, p);
  validate_training(effective, p);
  validate_parallelism(effective, p);
  return p.ToStatus();
}

RecallVocab RecallVocab::Of(const v1::RecallData& recall) {
  RecallVocab vocab;
  vocab.key_count = recall.key_vocab();
  vocab.first_value = vocab.first_key + vocab.key_count;
  vocab.value_count = recall.value_vocab();
  vocab.first_pair = vocab.first_value + vocab.value_count;
  vocab.pair_count = recall.pair_tokens() ? vocab.key_count * vocab.value_count : 0;
  return vocab;
}

}  // namespace hyscale
