#include "worker/trainer/trainer.h"

#include <absl/strings/str_cat.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>
#ifdef HYSCALE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#endif

#include "kernels/torch/compat.h"
#include "kernels/torch/ops.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "proto/constants.h"
#include "worker/parallel/context_parallel_group.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/data.h"
#include "worker/trainer/evaluation.h"
#include "worker/trainer/events.h"
#include "worker/trainer/optimizer.h"
#include "worker/trainer/schedule.h"
#include "worker/trainer/tensor_memory.h"

namespace hyscale::trainer {
namespace {

constexpr int64_t kRecallRows = 64;
// Rows whose selections key_sharing compares: groups of up to 64 adjacent queries.
constexpr int64_t kSharingRows = kMaxKeySharingGroup;

// The device's peak: the CUDA caching allocator's (what tensors took), else the process's RSS.
int64_t peak_memory_bytes(torch::Device device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        device.has_index() ? device.index() : c10::DeviceIndex{0});
    return stats.allocated_bytes[0].peak;  // [0]: the aggregate over pool types
  }
#else
  (void)device;
#endif
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

torch::Tensor to_tensor(const std::vector<int32_t>& values, int64_t rows, int64_t cols) {
  return torch::tensor(values, torch::kInt32).view({rows, cols}).to(torch::kInt64);
}

std::vector<int32_t> to_vector(const torch::Tensor& t) {
  const auto flat = t.to(torch::kCPU, torch::kInt32).contiguous();
  return std::vector<int32_t>(flat.data_ptr<int32_t>(), flat.data_ptr<int32_t>() + flat.numel());
}

// The initial weights are a function of the job's seed alone (drawn on the CPU, then moved), so
// every rank of a context-parallel group starts from the same ones.
DsaModel seeded_model(const v1::JobSpec& spec, torch::Device device) {
  torch::manual_seed(spec.seed());
  DsaModel model(ModelConfig::FromSpec(spec.model()));
  model->to(device);
  return model;
}

// The device memory this process can use: what the device has free plus what the CUDA caching
// allocator already holds (the weights, say).
int64_t usable_memory_bytes(torch::Device device) {
#ifdef HYSCALE_HAVE_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : c10::DeviceIndex{0};
    size_t free = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return static_cast<int64_t>(free) + stats.reserved_bytes[0].current;
  }
#else
  (void)device;
#endif
  return 0;
}

v1::TrainerEventLine::MemoryPrediction predicted_memory(
    const server::planner::MemoryBreakdown& memory) {
  v1::TrainerEventLine::MemoryPrediction out;
  out.set_weights_bytes(static_cast<int64_t>(memory.weights));
  out.set_activations_bytes(static_cast<int64_t>(memory.activations));
  out.set_indices_bytes(static_cast<int64_t>(memory.indices));
  out.set_gathered_bytes(static_cast<int64_t>(memory.gathered));
  out.set_workspace_bytes(static_cast<int64_t>(memory.workspace));
  out.set_total_bytes(static_cast<int64_t>(memory.total));
  return out;
}

void throw_if_error(const absl::Status& status) {
  if (!status.ok()) throw std::runtime_error(std::string(status.message()));
}

// The step's peak of CPU tensor bytes and what was alive then, by the phase that allocated it.
v1::TrainerEventLine::TensorMemory tensor_memory_of_step() {
  const tensor_memory::Counts counts = tensor_memory::Read();
  v1::TrainerEventLine::TensorMemory out;
  out.set_peak_bytes(counts.peak_bytes);
  const auto name = [](int tag) {
    return PhaseClock::SlotName(tag == tensor_memory::kUntagged ? -1 : tag);
  };
  out.set_peak_phase(name(counts.peak_tag));
  for (int tag = 0; tag <= tensor_memory::kUntagged; ++tag) {
    if (counts.peak_by_tag[tag] > 0)
      (*out.mutable_peak_by_phase())[name(tag)] = counts.peak_by_tag[tag];
  }
  return out;
}

// One batch as this rank trains on it: the token columns at its global positions.
struct Shard {
  torch::Tensor inputs, targets;  // [B, T]
  torch::Tensor positions;        // [T] global, increasing
};

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
        model_(seeded_model(spec, options.device)),
        optimizer_(make_adamw(*model_, spec.optimizer())),
        checkpoints_(spec.checkpoint().dir(), spec.checkpoint().keep(), options.attempt),
        clock_(c10::make_intrusive<PhaseClock>(options.device)) {
    for (const auto& p : model_->indexer_parameters())
      indexer_params_.insert(p.unsafeGetTensorImpl());
  }

  absl::Status ClaimCheckpoints() { return checkpoints_.Claim(); }

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

  // Collectives fail by exception inside autograd (a dead or stuck rank), kernels on bad shapes.
  absl::Status Run() {
    try {
      return RunSteps();
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("at step ", step_ + 1, ": ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("at step ", step_ + 1, ": ", e.what()));
    }
  }

 private:
  absl::Status RunSteps() {
    const int64_t total = plan_.total_steps();
    int current_stage = -1;
    while (step_ < total) {
      const int64_t step = step_ + 1;
      const auto position = plan_.locate(step);
      if (position.stage != current_stage) {
        current_stage = position.stage;
        const auto& stage = plan_.stage(position.stage);
        const ForwardOptions options = forward_options(stage);
        const auto& predicted = memory_plan(shape_of(stage), options);
        events_.StageStarted(position.stage, stage, step, options.query_chunk,
                             predicted_memory(predicted.memory));
        // On a GPU the prediction is against what this process can have: say when even the
        // smallest chunk is predicted not to fit, before the step that would run out of memory.
        if (options_.device.is_cuda() && !predicted.rejected.empty()) {
          events_.Warning(
              absl::StrCat("stage ", position.stage, " (", stage.name(),
                           "): the planner predicts it does not fit: ", predicted.rejected));
        }
      }
      StepEvent metrics = TrainStep(step, position);
      if (!std::isfinite(metrics.loss())) {
        return absl::InternalError(absl::StrCat(
            "loss is not finite at step ", step, " (",
            metrics.has_lm_loss() ? absl::StrCat("lm_loss ", metrics.lm_loss(), ", ") : "",
            "indexer_loss ", metrics.indexer_loss(), ")"));
      }
      step_ = step;
      const bool stage_end = step == plan_.last_step_of(position.stage);
      const int eval_every = spec_.eval_every();
      if (options_.evaluate && (stage_end || (eval_every > 0 && step % eval_every == 0))) {
        *metrics.mutable_evaluation() = Evaluate(position);
      }
      events_.Step(metrics, total);
      const int every = spec_.checkpoint().every_steps();
      // Ranks hold identical weights: rank 0 writes for all.
      if (rank() == 0 && !spec_.checkpoint().dir().empty() &&
          (step == total || (every > 0 && step % every == 0))) {
        if (auto status = Save(); !status.ok()) return status;
      }
      if (stage_end) events_.StageFinished(position.stage, plan_.stage(position.stage), step);
    }
    return absl::OkStatus();
  }

  // This rank's context-parallel group; null when the process holds whole sequences.
  parallel::ContextParallelGroup* cp() const { return options_.context_parallel.get(); }
  int rank() const { return cp() ? cp()->rank() : 0; }
  int world_size() const { return cp() ? cp()->world_size() : 1; }

  // This rank's part of a batch, with the exchanges of its length set in `options`.
  Shard shard(const Batch& batch, ForwardOptions& options) const {
    Shard s;
    s.inputs = to_tensor(batch.inputs, batch.batch_size, batch.seq_len);
    s.targets = to_tensor(batch.targets, batch.batch_size, batch.seq_len);
    if (!cp()) {
      s.positions = torch::arange(batch.seq_len, torch::kLong);
    } else {
      auto exchanges = cp()->exchanges(batch.seq_len);
      throw_if_error(exchanges.status());
      options.key_exchange = exchanges->keys;
      options.indexer_key_exchange = exchanges->indexer_keys;
      s.positions = exchanges->keys->positions();
      s.inputs = s.inputs.index_select(1, s.positions);
      s.targets = s.targets.index_select(1, s.positions);
    }
    s.inputs = s.inputs.to(options_.device);
    s.targets = s.targets.to(options_.device);
    return s;
  }

  // Sums `values` over the ranks (a no-op alone).
  torch::Tensor sum_over_ranks(std::vector<double> values) const {
    auto t = torch::tensor(values, torch::kDouble);
    if (!cp()) return t;
    t = t.to(options_.device);
    throw_if_error(cp()->sum(t));
    return t.to(torch::kCPU);
  }

  bool is_indexer(const torch::Tensor& p) const {
    return indexer_params_.count(p.unsafeGetTensorImpl()) > 0;
  }

  ForwardOptions forward_options(const v1::StageSpec& stage) const {
    ForwardOptions o;
    o.attention = stage.attention() == v1::DENSE ? AttentionMode::kDense : AttentionMode::kSparse;
    if (options_.attention) o.attention = *options_.attention;
    o.indexer_loss = options_.indexer_loss;
    o.recompute = options_.recompute.value_or(spec_.recompute().enabled());
    o.selection_replay = options_.selection_replay.value_or(spec_.recompute().selection_replay());
    o.bf16_autocast = options_.device.is_cuda();
    o.query_group = spec_.parallelism().query_group();
    // A frozen main model: the indexer learns inside the forward (nothing to backpropagate after),
    // and its step reports no LM loss (the frozen model's does not change): no logits.
    o.frozen_main = stage.trains() == v1::INDEXER_ONLY;
    o.frozen_logits = false;
    o.indexer_grad_scale = stage.indexer_loss_weight() / static_cast<double>(world_size());
    o.query_chunk = memory_plan(shape_of(stage), o).candidate.query_chunk;
    return o;
  }

  // The planner's prediction (planner/cost_model.h) of a step at `shape` as `o` runs it, with its
  // query chunk: recompute.query_chunk, or for 0 with recomputation or a frozen main model on a
  // GPU the largest chunk that fits the memory this process can have (what the device has free plus
  // what the caching allocator holds), 0 when the whole local sequence fits. The CPU runs whole
  // sequences unless told otherwise. A frozen dense chunk the planner picked is rounded down to
  // whole waves of the warm-up loss's query-major kernel: no part-empty wave a chunk (2048 -> 1980
  // rows at 128K on 132 SMs, 2.6 % of the step). Made once a shape, before its first step.
  const server::planner::Prediction& memory_plan(const BatchShape& shape,
                                                 const ForwardOptions& o) const {
    const bool dense = o.attention == AttentionMode::kDense;
    const auto key =
        std::make_tuple(shape.seq_len, shape.batch_size, dense, o.recompute, o.frozen_main);
    if (const auto known = memory_plans_.find(key); known != memory_plans_.end()) {
      return known->second;
    }
    v1::JobSpec at_shape = spec_;
    at_shape.mutable_data()->set_seq_len(static_cast<int32_t>(shape.seq_len));
    at_shape.mutable_data()->set_batch_size(static_cast<int32_t>(shape.batch_size));
    at_shape.clear_stages();
    auto* stage = at_shape.add_stages();
    stage->set_attention(dense ? v1::DENSE : v1::SPARSE);
    if (o.frozen_main) stage->set_trains(v1::INDEXER_ONLY);
    at_shape.mutable_recompute()->set_enabled(o.recompute);
    at_shape.mutable_recompute()->set_selection_replay(o.selection_replay);
    if (!o.recompute) at_shape.mutable_recompute()->set_query_chunk(0);
    const bool cuda = options_.device.is_cuda();
    auto profile = server::planner::BuiltinProfile(cuda ? "h200" : "cpu").value();
    if (cuda) profile.memory_bytes = static_cast<double>(usable_memory_bytes(options_.device));
    const auto work = server::planner::Workload::Of(at_shape);
    const auto candidate = server::planner::CandidateOf(at_shape);
    auto plan = cuda ? server::planner::PredictFitted(work, candidate, profile, world_size())
                     : server::planner::Predict(work, candidate, profile, world_size());
    int64_t& chunk = plan.candidate.query_chunk;
    if (dense && o.frozen_main && chunk > 0 && spec_.recompute().query_chunk() == 0) {
      const auto& indexer = spec_.model().indexer();
      const int64_t multiple = ops::dense_indexer_kl_row_multiple(
          torch::empty({indexer.heads(), indexer.dim()}, torch::TensorOptions(options_.device)));
      if (chunk > multiple) chunk -= chunk % multiple;
    }
    return memory_plans_.emplace(key, std::move(plan)).first->second;
  }

  // The stage's own batch shape, or the data's (0 in the spec).
  BatchShape shape_of(const v1::StageSpec& stage) const {
    BatchShape shape = data_->default_shape();
    if (stage.seq_len() > 0) shape.seq_len = stage.seq_len();
    if (stage.batch_size() > 0) shape.batch_size = stage.batch_size();
    return shape;
  }

  StepEvent TrainStep(int64_t step, const StagePlan::Position& position) {
    const auto start = std::chrono::steady_clock::now();
    const auto& stage = plan_.stage(position.stage);
    const bool main_trains = stage.trains() != v1::INDEXER_ONLY;
    for (auto& p : model_->parameters()) p.set_requires_grad(main_trains || is_indexer(p));

    const bool count_memory = options_.count_tensor_memory;
    if (count_memory) tensor_memory::ResetPeak();
    clock_->start();
    ForwardOptions options = forward_options(stage);
    options.clock = clock_;
    Shard batch;
    int64_t batch_tokens = 0, counted = 0;
    {
      PhaseClock::Scope scope(*clock_, v1::STEP_PHASE_DATA);
      const Batch whole = data_->Get(Split::kTrain, step - 1, shape_of(stage));
      batch_tokens = whole.batch_size * whole.seq_len;
      for (int32_t t : whole.targets) counted += t >= 0 ? 1 : 0;
      batch = shard(whole, options);
    }
    clear_gradients(*model_);
    torch::Tensor lm_loss, indexer_loss, loss;
    ForwardResult result;  // its indexer loss's value is complete once backward has run
    {
      compat::CudaBf16Autocast autocast(options.bf16_autocast);
      result = model_->forward(batch.inputs, options);
      PhaseClock::Scope scope(*clock_, v1::STEP_PHASE_LM_HEAD);
      indexer_loss = result.indexer_loss.to(torch::kFloat) / static_cast<double>(world_size());
      loss = stage.indexer_loss_weight() * indexer_loss;
      if (result.logits.defined()) {  // (not in a frozen step: options.frozen_logits)
        // Each rank's loss is its tokens' share of the whole batch's mean: the ranks' gradients
        // then add up to the gradient of the whole batch's loss.
        lm_loss = torch::nn::functional::cross_entropy(
                      result.logits.view({-1, result.logits.size(-1)}).to(torch::kFloat),
                      batch.targets.view(-1),
                      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(
                          torch::kSum)) /
                  static_cast<double>(std::max<int64_t>(counted, 1));
        result.logits = torch::Tensor();  // the loss holds what backward needs
        loss = (main_trains ? lm_loss : lm_loss.detach()) + loss;
      }
    }
    {
      PhaseClock::PassGuard pass(*clock_, v1::STEP_PASS_BWD);
      if (main_trains) {
        PhaseClock::BackwardAttribution attribution(*clock_);
        loss.backward();
      }
      if (cp()) {
        PhaseClock::Scope scope(*clock_, v1::STEP_PHASE_COMM);
        throw_if_error(cp()->sum_gradients(model_->parameters()));
      }
    }
    const double lr = plan_.learning_rate(step);
    {
      PhaseClock::Scope scope(*clock_, v1::STEP_PHASE_OPTIMIZER);
      set_learning_rate(*optimizer_, lr);
      adamw_step(*optimizer_, model_->parameters(), spec_.optimizer().grad_clip());
    }
    // The indexer loss's value is known once backward ran (recomputation, or the attention
    // backward that forms its target, computes it).
    const double lm_value = lm_loss.defined() ? lm_loss.item<double>() : 0;
    const double indexer_value =
        result.reported_indexer_loss().item<double>() / static_cast<double>(world_size());
    const auto losses = sum_over_ranks(
        {lm_value, indexer_value, lm_value + stage.indexer_loss_weight() * indexer_value});
    // The phases cover the step from start() to take(), which waits for the device.
    auto phase_seconds = clock_->take();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    StepEvent m;
    m.set_step(step);
    m.set_stage(position.stage);
    if (lm_loss.defined()) m.set_lm_loss(losses[0].item<double>());
    m.set_indexer_loss(losses[1].item<double>());
    m.set_loss(losses[2].item<double>());
    m.set_lr(lr);
    m.set_step_seconds(seconds);
    m.set_tokens_per_second(static_cast<double>(batch_tokens) / seconds);
    m.set_peak_memory_bytes(peak_memory_bytes(options_.device));
    m.mutable_phase_seconds()->insert(phase_seconds.begin(), phase_seconds.end());
    if (count_memory) *m.mutable_tensor_memory() = tensor_memory_of_step();
    if (cp()) {
      const parallel::CommTimes times = cp()->take_times();
      m.mutable_comm()->set_exposed(times.exposed_s);
      m.mutable_comm()->set_overlapped(times.overlapped_s);
    }
    return m;
  }

  v1::TrainerEventLine::Evaluation Evaluate(const StagePlan::Position& position) {
    torch::NoGradGuard no_grad;
    ForwardOptions options = forward_options(plan_.stage(position.stage));
    // Evaluation runs at the data's shape, which a stage's may not be: its chunk is the one a
    // training step of that shape would take (no graph is kept, so it fits).
    options.query_chunk = memory_plan(data_->default_shape(), options).candidate.query_chunk;
    options.recompute = false;
    QueryAccuracy accuracy;
    IndexerRecall recall;
    KeySharing sharing(kSharingRows);
    const int batches = std::max(1, spec_.data().eval_batches());
    for (int i = 0; i < batches; ++i) {
      const Batch whole = data_->Get(Split::kEval, i);
      const Shard batch = shard(whole, options);
      // The first batch's recall rows only: every row's queries would be H d_qk a token and
      // layer (tens of GiB at long context).
      options.keep_probes = i == 0;
      torch::Tensor targets;  // the whole batch's, for the recall
      if (options.keep_probes) {
        targets = to_tensor(whole.targets, whole.batch_size, whole.seq_len);
        // The recall's rows and the key sharing's, once each, increasing.
        const auto both =
            torch::cat({recall_rows(targets, batch.positions, model_->config(), kRecallRows),
                        sharing_rows(batch.positions, model_->config(), kSharingRows)});
        const auto sorted = std::get<0>(both.sort());
        options.probe_rows = std::get<0>(torch::unique_consecutive(sorted)).to(options_.device);
      }
      compat::CudaBf16Autocast autocast(options.bf16_autocast);
      const auto result = model_->forward(batch.inputs, options);
      // Same layout by construction: a length mismatch is a bug, and value() throws on it.
      const auto scored =
          ScoreQueries(predicted_tokens(result.logits), to_vector(batch.targets)).value();
      accuracy.correct += scored.correct;
      accuracy.counted += scored.counted;
      if (options.keep_probes) {
        recall =
            indexer_recall(result.probes, targets, batch.positions, model_->config(), kRecallRows);
        sharing = key_sharing(result.probes, batch.positions, model_->config(), kSharingRows);
      }
    }
    std::vector<double> totals = {static_cast<double>(accuracy.correct),
                                  static_cast<double>(accuracy.counted), recall.total,
                                  static_cast<double>(recall.rows)};
    totals.insert(totals.end(), sharing.selected.begin(), sharing.selected.end());
    totals.insert(totals.end(), sharing.distinct.begin(), sharing.distinct.end());
    const auto sums = sum_over_ranks(totals);
    accuracy.correct = static_cast<int64_t>(sums[0].item<double>());
    accuracy.counted = static_cast<int64_t>(sums[1].item<double>());
    recall.total = sums[2].item<double>();
    recall.rows = static_cast<int64_t>(sums[3].item<double>());
    const size_t groups = sharing.groups.size();
    v1::TrainerEventLine::Evaluation e;
    e.set_accuracy(accuracy.value());
    e.set_indexer_recall(recall.value());
    for (size_t i = 0; i < groups; ++i) {
      sharing.selected[i] = sums[4 + i].item<double>();
      sharing.distinct[i] = sums[4 + groups + i].item<double>();
      if (sharing.distinct[i] == 0) continue;  // no rank had G rows seeing more than topk keys
      auto* shared = e.add_key_sharing();
      shared->set_group(static_cast<int32_t>(sharing.groups[i]));
      shared->set_selected_per_distinct(sharing.ratio(i));
    }
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
  c10::intrusive_ptr<PhaseClock> clock_;  // every step's phases, on the training device
  int64_t step_ = 0;
  // memory_plan() by (seq_len, batch_size, dense, recompute, frozen_main).
  mutable std::map<std::tuple<int64_t, int64_t, bool, bool, bool>, server::planner::Prediction>
      memory_plans_;
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::JobSpec& spec,
                                                         const TrainerOptions& options,
                                                         EventSink& events) {
  auto data = MakeDataSource(spec);
  if (!data.ok()) return data.status();
  if (options.count_tensor_memory) {
    // Before the model exists, so that its weights are counted (as "untimed").
    static_assert(v1::StepPhase_MAX * v1::StepPass_MAX <= tensor_memory::kTags);
    tensor_memory::Install(&PhaseClock::ActiveSlot);
  }
  auto impl = std::make_unique<Impl>(spec, options, events, std::move(*data));
  if (!spec.checkpoint().dir().empty()) {
    if (auto status = impl->ClaimCheckpoints(); !status.ok()) return status;
  }
  if (options.resume) {
    if (auto status = impl->Resume(); !status.ok()) return status;
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::Status Trainer::Run() {
  return impl_->Run();
}

}  // namespace hyscale::trainer
