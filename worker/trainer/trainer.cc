#include "worker/trainer/trainer.h"

#include <absl/strings/str_cat.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "worker/trainer/checkpoint.h"
#include "worker/trainer/data.h"
#include "worker/trainer/evaluation.h"
#include "worker/trainer/events.h"
#include "worker/trainer/optimizer.h"
#include "worker/trainer/schedule.h"

namespace hyscale::trainer {
namespace {

constexpr int64_t kRecallRows = 64;

int64_t peak_memory_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

torch::Tensor to_tensor(const std::vector<int32_t>& values, int64_t rows, int64_t cols) {
  return torch::tensor(values, torch::kInt32).view({rows, cols}).to(torch::kInt64);
}

// The initial weights are a function of the job's seed alone.
DsaModel seeded_model(const v1::JobSpec& spec) {
  torch::manual_seed(spec.seed());
  return DsaModel(ModelConfig::FromSpec(spec.model()));
}

}  // namespace

class Trainer::Impl {
 public:
  Impl(const v1::JobSpec& spec, const TrainerOptions& options, EventSink& events,
       std::unique_ptr<DataSource> data)
      : spec_(spec),
        options_(options),
        events_(events),
        plan_(spec),
        data_(std::move(data)),
        model_(seeded_model(spec)),
        optimizer_(make_adamw(*model_, spec.optimizer())),
        checkpoints_(spec.checkpoint().dir(), spec.checkpoint().keep()) {
    for (const auto& p : model_->indexer_parameters())
      indexer_params_.insert(p.unsafeGetTensorImpl());
  }

  absl::Status Resume() {
    std::vector<std::string> warnings;
    auto loaded = checkpoints_.LoadLatest(*model_, *optimizer_, &warnings);
    for (const auto& w : warnings) events_.Warning(w);
    if (absl::IsNotFound(loaded.status())) {
      events_.Warning("no checkpoint to resume from in " + spec_.checkpoint().dir() +
                      "; starting at step 0");
      return absl::OkStatus();
    }
    if (!loaded.ok()) return loaded.status();
    step_ = *loaded;
    events_.CheckpointLoaded(step_, checkpoints_.PathOf(step_));
    return absl::OkStatus();
  }

  absl::Status Run() {
    const int64_t total = plan_.total_steps();
    int current_stage = -1;
    while (step_ < total) {
      const int64_t step = step_ + 1;
      const auto position = plan_.locate(step);
      if (position.stage != current_stage) {
        current_stage = position.stage;
        events_.StageStarted(position.stage, plan_.stage(position.stage), step);
      }
      StepMetrics metrics = TrainStep(step, position);
      if (!std::isfinite(metrics.loss)) {
        return absl::InternalError(absl::StrCat("loss is not finite at step ", step, " (lm_loss ",
                                                metrics.lm_loss, ", indexer_loss ",
                                                metrics.indexer_loss, ")"));
      }
      step_ = step;
      const bool stage_end = step == plan_.last_step_of(position.stage);
      const int eval_every = spec_.eval_every();
      if (stage_end || (eval_every > 0 && step % eval_every == 0)) {
        metrics.eval = Evaluate(position);
      }
      events_.Step(metrics, total);
      const int every = spec_.checkpoint().every_steps();
      if (!spec_.checkpoint().dir().empty() &&
          (step == total || (every > 0 && step % every == 0))) {
        if (auto status = Save(); !status.ok()) return status;
      }
      if (stage_end) events_.StageFinished(position.stage, plan_.stage(position.stage), step);
    }
    return absl::OkStatus();
  }

 private:
  bool is_indexer(const torch::Tensor& p) const {
    return indexer_params_.count(p.unsafeGetTensorImpl()) > 0;
  }

  ForwardOptions forward_options(const v1::StageSpec& stage) const {
    ForwardOptions o;
    o.attention = stage.attention() == v1::DENSE ? AttentionMode::kDense : AttentionMode::kSparse;
    if (options_.attention) o.attention = *options_.attention;
    o.indexer_loss = true;
    o.recompute = options_.recompute.value_or(spec_.recompute().enabled());
    o.selection_replay = options_.selection_replay.value_or(spec_.recompute().selection_replay());
    return o;
  }

  // The stage's own batch shape, or the data's (0 in the spec).
  BatchShape shape_of(const v1::StageSpec& stage) const {
    BatchShape shape = data_->default_shape();
    if (stage.seq_len() > 0) shape.seq_len = stage.seq_len();
    if (stage.batch_size() > 0) shape.batch_size = stage.batch_size();
    return shape;
  }

  StepMetrics TrainStep(int64_t step, const StagePlan::Position& position) {
    const auto start = std::chrono::steady_clock::now();
    const auto& stage = plan_.stage(position.stage);
    const bool main_trains = stage.trains() != v1::INDEXER_ONLY;
    for (auto& p : model_->parameters()) p.set_requires_grad(main_trains || is_indexer(p));

    auto clock = c10::make_intrusive<PhaseClock>();
    torch::Tensor inputs, targets;
    {
      PhaseClock::Scope scope(*clock, Phase::kData);
      const Batch batch = data_->Get(Split::kTrain, step - 1, shape_of(stage));
      inputs = to_tensor(batch.inputs, batch.batch_size, batch.seq_len);
      targets = to_tensor(batch.targets, batch.batch_size, batch.seq_len);
    }
    ForwardOptions options = forward_options(stage);
    options.clock = clock;
    clear_gradients(*model_);
    const auto result = model_->forward(inputs, options);
    const auto lm_loss = torch::nn::functional::cross_entropy(
        result.logits.view({-1, result.logits.size(-1)}), targets.view(-1),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
    const auto loss = (main_trains ? lm_loss : lm_loss.detach()) +
                      stage.indexer_loss_weight() * result.indexer_loss;
    loss.backward();
    const double lr = plan_.learning_rate(step);
    {
      PhaseClock::Scope scope(*clock, Phase::kOptimizer);
      if (spec_.optimizer().grad_clip() > 0) {
        torch::nn::utils::clip_grad_norm_(model_->parameters(), spec_.optimizer().grad_clip());
      }
      set_learning_rate(*optimizer_, lr);
      optimizer_->step();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    StepMetrics m;
    m.step = step;
    m.stage = position.stage;
    m.loss = loss.item<double>();
    m.lm_loss = lm_loss.item<double>();
    m.indexer_loss = result.indexer_loss.item<double>();
    m.lr = lr;
    m.step_seconds = seconds;
    m.tokens_per_second = static_cast<double>(inputs.numel()) / seconds;
    m.peak_memory_bytes = peak_memory_bytes();
    const auto phases = clock->take();
    for (size_t i = 0; i < kPhaseCount; ++i) {
      m.phase_seconds[phase_name(static_cast<Phase>(i))] = phases[i];
    }
    return m;
  }

  EvalMetrics Evaluate(const StagePlan::Position& position) {
    torch::NoGradGuard no_grad;
    ForwardOptions options = forward_options(plan_.stage(position.stage));
    options.recompute = false;
    options.keep_probes = true;
    QueryAccuracy accuracy;
    double recall = 0.0;
    const int batches = std::max(1, spec_.data().eval_batches());
    for (int i = 0; i < batches; ++i) {
      const Batch batch = data_->Get(Split::kEval, i);
      const auto inputs = to_tensor(batch.inputs, batch.batch_size, batch.seq_len);
      const auto targets = to_tensor(batch.targets, batch.batch_size, batch.seq_len);
      const auto result = model_->forward(inputs, options);
      // Same layout by construction: a length mismatch is a bug, and value() throws on it.
      const auto scored = ScoreQueries(predicted_tokens(result.logits), batch.targets).value();
      accuracy.correct += scored.correct;
      accuracy.counted += scored.counted;
      if (i == 0) recall = indexer_recall(result.probes, targets, model_->config(), kRecallRows);
    }
    EvalMetrics e;
    e.accuracy = accuracy.value();
    e.indexer_recall = recall;
    return e;
  }

  absl::Status Save() {
    auto status = checkpoints_.Save(step_, *model_, *optimizer_);
    if (status.ok()) events_.CheckpointWritten(step_, checkpoints_.PathOf(step_));
    return status;
  }

  const v1::JobSpec spec_;
  const TrainerOptions options_;
  EventSink& events_;
  const StagePlan plan_;
  std::unique_ptr<DataSource> data_;
  DsaModel model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  TrainingCheckpoints checkpoints_;
  std::set<const void*> indexer_params_;
  int64_t step_ = 0;
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::JobSpec& spec,
                                                         const TrainerOptions& options,
                                                         EventSink& events) {
  auto data = MakeDataSource(spec);
  if (!data.ok()) return data.status();
  auto impl = std::make_unique<Impl>(spec, options, events, std::move(*data));
  if (options.resume) {
    if (auto status = impl->Resume(); !status.ok()) return status;
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::Status Trainer::Run() {
  return impl_->Run();
}

}  // namespace hyscale::trainer
