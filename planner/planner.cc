#include "planner/planner.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include "proto/cp_layout.h"

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

// One layer's lightning indexer: wq, wk, ww and k_norm's weight and bias.
int64_t IndexerParametersPerLayer(const v1::ModelSpec& m) {
  const int64_t d = m.d_model();
  const auto& ix = m.indexer();
  return d * ix.heads() * ix.dim() + d * ix.dim() + d * ix.heads() + 2 * int64_t{ix.dim()};
}

}  // namespace

int64_t IndexerParameterCount(const v1::ModelSpec& m) {
  return int64_t{m.layers()} * IndexerParametersPerLayer(m);
}

int64_t ParameterCount(const v1::ModelSpec& m) {
  const int64_t d = m.d_model();
  const int64_t values = m.latent_kv() ? 0 : d * m.head_dim_v();  // a latent has no projection
  const int64_t attention = d * m.heads() * m.head_dim_qk() + d * m.head_dim_qk() + values +
                            int64_t{m.heads()} * m.head_dim_v() * d;
  const int64_t indexer = IndexerParametersPerLayer(m);
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
  const int64_t chunk = spec.recompute().query_chunk();
  const int64_t chunk_tokens =
      chunk > 0 ? int64_t{std::max(1, spec.data().batch_size())} *
                      std::min<int64_t>(chunk, std::max(1, spec.data().seq_len()))
                : tokens;
  const int64_t saved = spec.recompute().enabled()
                            ? layers * kFloatBytes * tokens * m.d_model() +
                                  kFloatBytes * chunk_tokens * per_token_layer
                            : layers * full_layer;
  const int64_t logits = 2 * kFloatBytes * tokens * m.vocab_size();
  e.activation_bytes = saved + logits;
  const int64_t sum = e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes + e.activation_bytes;
  e.total_bytes = sum + sum / 10;
  return e;
}

std::vector<Candidate> EnumerateCandidates(const Workload& work, const PlanOptions& options) {
  const bool megatron = options.stack != Stack::kHyScale;
  const auto allowed = [](const auto& list, auto value) {
    return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
  };
  std::vector<Recompute> policies;
  for (Recompute r : {Recompute::kNone, Recompute::kReplay, Recompute::kReselect}) {
    const bool supported = r != Recompute::kReplay || (work.sparse && !megatron);
    if (supported && allowed(options.recompute, r)) policies.push_back(r);
  }
  std::vector<int> groups = {1};
  if (work.sparse && !megatron) groups.assign(std::begin(kQueryGroups), std::end(kQueryGroups));
  const int64_t need = std::max<int64_t>(1, work.seq_len / kMinShardTokens);

  std::vector<Candidate> out;
  for (int cp = 1; cp <= options.gpus && cp <= need; ++cp) {
    if (options.gpus % cp != 0) continue;
    // With one rank per sequence there is nothing to lay out or exchange.
    std::vector<CpLayout> layouts = {v1::CP_LAYOUT_CONTIGUOUS};
    std::vector<IndexerGroup> indexer = {IndexerGroup::kShared};
    if (cp > 1) {
      layouts = {v1::CP_LAYOUT_CONTIGUOUS, v1::CP_LAYOUT_ZIGZAG, v1::CP_LAYOUT_ROUND_ROBIN};
      if (!megatron) indexer.push_back(IndexerGroup::kSeparate);
    }
    for (CpLayout layout : layouts) {
      for (IndexerGroup ig : indexer) {
        if (!allowed(options.indexer_groups, ig)) continue;
        for (int g : groups) {
          for (Recompute r : policies) out.push_back({cp, layout, ig, g, r, options.stack});
        }
      }
    }
  }
  return out;
}

namespace {

std::string Seconds(double s) {
  return s >= 1 ? absl::StrFormat("%.2f s", s) : absl::StrFormat("%.1f ms", s * 1e3);
}

// What candidates are ranked by: the job's seconds of steps, where its stages differ in cost (a
// dense warm-up, then sparse), else the step's (a spec without steps).
double RankSeconds(const Prediction& p) {
  return p.job_s > 0 ? p.job_s : p.step_s;
}

// The term that grew most from `winner` to `other`, e.g. "selection +1.20 s".
std::string BiggestLoss(const Prediction& winner, const Prediction& other) {
  std::string term;
  double worst = -1;
  for (const auto& [name, s] : other.seconds) {
    const double delta = s - winner.seconds.at(name);
    if (delta > worst) {
      worst = delta;
      term = name;
    }
  }
  std::string line = absl::StrCat(term, " +", Seconds(worst));
  if (term == "selection" && other.imbalance > winner.imbalance * 1.05) {
    absl::StrAppend(&line, " (causal imbalance ", absl::StrFormat("%.2f", other.imbalance), "x)");
  }
  return line;
}

// For one choice of the winner: the best plan that differs from it only there, and why it lost.
template <typename Same>
std::string Compare(const std::string& choice, const PlanResult& plan, Same same_elsewhere) {
  const Prediction& winner = plan.candidates[plan.winner];
  const Prediction* best = nullptr;
  const Prediction* best_rejected = nullptr;
  for (const auto& p : plan.candidates) {
    if (&p == &winner || !same_elsewhere(p.candidate, winner.candidate)) continue;
    if (p.rejected.empty() && (best == nullptr || RankSeconds(p) < RankSeconds(*best))) best = &p;
    if (!p.rejected.empty() && best_rejected == nullptr) best_rejected = &p;
  }
  if (best != nullptr) {
    return absl::StrFormat(
        "%s: next best %s is %.1f%% slower%s (%s)", choice, best->candidate.Describe(),
        100 * (RankSeconds(*best) / RankSeconds(winner) - 1),
        plan.stages.size() > 1 ? " over the job" : "", BiggestLoss(winner, *best));
  }
  if (best_rejected != nullptr) {
    return absl::StrCat(choice, ": the alternatives do not fit (",
                        best_rejected->candidate.Describe(), ": ", best_rejected->rejected, ")");
  }
  return absl::StrCat(choice, ": the only choice");
}

// The winner on each stage of a job with several (their attention, what they train and their
// batch shapes differ: a dense warm-up before the sparse stage, a length curriculum): each stage's
// prediction, the job's seconds of steps, and a note a stage and one for the job.
void PlanStages(const v1::JobSpec& spec, const PlanOptions& options, PlanResult* plan) {
  PredictJob(spec, plan->candidates[plan->winner].candidate, options.profile, options.gpus,
             &plan->stages);
  for (int i = 0; i < spec.stages_size(); ++i) {
    const v1::StageSpec& stage = spec.stages(i);
    const Workload work = Workload::OfStage(spec, i);
    const Prediction& p = plan->stages[i];
    plan->notes.push_back(absl::StrCat(
        "stage '", stage.name(), "' (", work.sparse ? "sparse" : "dense",
        work.indexer_only ? ", the indexer alone" : "", ", ", work.seq_len, " tokens x ",
        work.batch, ", ", stage.steps(), " steps): ", Seconds(p.step_s), " a step, ",
        absl::StrFormat("%.1f GiB", p.memory.total / (1 << 30)),
        p.candidate.query_chunk > 0 ? absl::StrCat(", chunks of ", p.candidate.query_chunk) : ""));
  }
  plan->job_seconds = plan->candidates[plan->winner].job_s;
  const double total = plan->job_seconds;
  plan->notes.push_back(absl::StrCat("the job's ", spec.stages_size(), " stages: ",
                                     total >= 3600 ? absl::StrFormat("%.2f h", total / 3600)
                                     : total >= 60 ? absl::StrFormat("%.1f min", total / 60)
                                                   : Seconds(total),
                                     " of steps (evaluations not counted)"));
}

}  // namespace

PlanResult PlanJob(const v1::JobSpec& spec, const PlanOptions& options) {
  const Workload work = Workload::Of(spec);
  PlanResult plan;
  for (const Candidate& c : EnumerateCandidates(work, options)) {
    plan.candidates.push_back(PredictJob(spec, c, options.profile, options.gpus));
  }
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const Prediction& a, const Prediction& b) {
                     if (a.rejected.empty() != b.rejected.empty()) return a.rejected.empty();
                     return RankSeconds(a) < RankSeconds(b);
                   });
  plan.notes.push_back(absl::StrCat(
      "profile ", options.profile.name, ", ", options.gpus, " devices, ", work.seq_len,
      " tokens x ", work.batch, " sequences, ", work.sparse ? "sparse" : "dense", " attention"));
  int assumed = 0;
  for (const auto& [figure, source] : options.profile.sources) {
    assumed += absl::StartsWith(source, "assumption");
  }
  plan.notes.push_back(absl::StrCat(assumed, " of the profile's ", options.profile.sources.size(),
                                    " figures are assumptions, not measurements (`hyscale plan "
                                    "--sources` lists them)"));
  if (plan.candidates.empty() || !plan.candidates.front().rejected.empty()) {
    plan.why.push_back(plan.candidates.empty() ? "no candidate plans"
                                               : absl::StrCat("no plan fits; the first rejected: ",
                                                              plan.candidates.front().rejected));
    return plan;
  }
  plan.winner = 0;
  const Prediction& w = plan.candidates.front();
  plan.why.push_back(
      absl::StrCat("winner ", w.candidate.Describe(), ": ", Seconds(w.step_s),
                   " per step (compute ", Seconds(w.compute_s), ", exposed communication ",
                   Seconds(w.exposed_comm_s), " of ", Seconds(w.comm_s), "), ",
                   absl::StrFormat("%.1f GiB", w.memory.total / (1 << 30)), " per device"));
  if (spec.stages_size() > 1) PlanStages(spec, options, &plan);
  const auto same = [](auto field) {
    return [field](const Candidate& a, const Candidate& b) {
      Candidate x = a;
      field(x, b);  // copy b's value of everything but the field under comparison
      return x.cp == b.cp && x.layout == b.layout && x.indexer == b.indexer && x.group == b.group &&
             x.recompute == b.recompute;
    };
  };
  plan.why.push_back(Compare("context parallel", plan, same([](Candidate& x, const Candidate& b) {
                               x.cp = b.cp;
                               // Layout and group mean nothing at cp 1.
                               if (x.cp == 1 || b.cp == 1) {
                                 x.layout = b.layout;
                                 x.indexer = b.indexer;
                               }
                             })));
  if (w.candidate.cp > 1) {
    // Every other layout, so the causal imbalance of contiguous shows even when it is not next.
    const auto same_but_layout =
        same([](Candidate& x, const Candidate& b) { x.layout = b.layout; });
    for (CpLayout layout :
         {v1::CP_LAYOUT_CONTIGUOUS, v1::CP_LAYOUT_ZIGZAG, v1::CP_LAYOUT_ROUND_ROBIN}) {
      if (layout == w.candidate.layout) continue;
      plan.why.push_back(Compare("layout", plan, [&](const Candidate& a, const Candidate& b) {
        return a.layout == layout && same_but_layout(a, b);
      }));
    }
    plan.why.push_back(Compare("indexer group", plan, same([](Candidate& x, const Candidate& b) {
                                 x.indexer = b.indexer;
                               })));
  }
  plan.why.push_back(Compare("query group", plan,
                             same([](Candidate& x, const Candidate& b) { x.group = b.group; })));
  plan.why.push_back(Compare("recompute", plan, same([](Candidate& x, const Candidate& b) {
                               x.recompute = b.recompute;
                             })));
  return plan;
}

Candidate CandidateOf(const v1::JobSpec& spec) {
  const v1::ParallelismSpec& par = spec.parallelism();
  Candidate c;
  c.cp = std::max(1, par.context_parallel());
  // Empty or unknown (validation refuses the latter): contiguous.
  c.layout = ParseCpLayout(par.cp_layout()).value_or(v1::CP_LAYOUT_CONTIGUOUS);
  c.indexer = par.separate_indexer_group() ? IndexerGroup::kSeparate : IndexerGroup::kShared;
  c.group = std::max(1, par.query_group());
  if (spec.recompute().enabled()) {
    c.recompute = spec.recompute().selection_replay() ? Recompute::kReplay : Recompute::kReselect;
  }
  c.query_chunk = spec.recompute().query_chunk();
  return c;
}

}  // namespace hyscale::server::planner
