#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <nlohmann/json.hpp>

#include "client/commands/commands.h"
#include "client/format.h"
#include "planner/planner.h"
#include "proto/cp_layout.h"
#include "proto/job_spec.h"

namespace hyscale::cli {
namespace {

namespace planner = server::planner;

std::string Seconds(double s) {
  return s >= 1 ? absl::StrFormat("%.2f s", s) : absl::StrFormat("%.1f ms", s * 1e3);
}

nlohmann::json ToJson(const planner::Prediction& p) {
  const planner::Candidate& c = p.candidate;
  nlohmann::json out = {
      {"stack", planner::Name(c.stack)},
      {"context_parallel", c.cp},
      {"cp_layout", CpLayoutName(c.layout)},
      {"indexer_group", planner::Name(c.indexer)},
      {"query_group", c.group},
      {"recompute", planner::Name(c.recompute)},
      {"data_parallel", p.data_parallel},
      {"sequences_per_replica", p.sequences},
      {"step_seconds", p.step_s},
      {"job_seconds", p.job_s},
      {"compute_seconds", p.compute_s},
      {"comm_seconds", p.comm_s},
      {"exposed_comm_seconds", p.exposed_comm_s},
      {"causal_imbalance", p.imbalance},
      {"seconds", p.seconds},
      {"layer_seconds", p.layer},
      {"memory_bytes",
       {{"weights", p.memory.weights},
        {"activations", p.memory.activations},
        {"indices", p.memory.indices},
        {"gathered", p.memory.gathered},
        {"workspace", p.memory.workspace},
        {"total", p.memory.total}}},
  };
  if (!p.rejected.empty()) out["rejected"] = p.rejected;
  return out;
}

void PrintTable(const Context& context, const planner::PlanResult& plan, int top) {
  // A job of several stages is ranked on its time (JOB, h:mm:ss; STEP is its costly stage's).
  const bool stages = plan.stages.size() > 1;
  Table table(stages ? std::vector<std::string>{"PLAN", "JOB", "STEP", "COMPUTE", "EXPOSED COMM",
                                                "MEMORY", "STATUS"}
                     : std::vector<std::string>{"PLAN", "STEP", "COMPUTE", "EXPOSED COMM", "MEMORY",
                                                "STATUS"});
  int feasible = 0, rejected = 0, hidden = 0;
  for (const auto& p : plan.candidates) {
    int& shown = p.rejected.empty() ? feasible : rejected;
    if (top > 0 && shown >= top) {
      ++hidden;
      continue;
    }
    ++shown;
    std::string status = p.rejected.empty() ? "ok" : absl::StrCat("rejected: ", p.rejected);
    if (&p == &plan.candidates.front() && plan.winner == 0) status = "winner";
    std::vector<std::string> row = {p.candidate.Describe(),
                                    Seconds(p.step_s),
                                    Seconds(p.compute_s),
                                    Seconds(p.exposed_comm_s),
                                    FormatBytes(static_cast<int64_t>(p.memory.total)),
                                    status};
    if (stages) row.insert(row.begin() + 1, FormatDuration(p.job_s));
    table.AddRow(row);
  }
  table.Print(*context.out);
  if (hidden > 0) {
    *context.out << "(" << hidden << " more candidates not shown; --top 0 shows all)\n";
  }
}

int PlanOffline(const Context& context, const PlanArgs& args, const v1::JobSpec& spec) {
  planner::PlanOptions options;
  options.gpus = args.gpus > 0 ? args.gpus : 1;
  auto profile = planner::BuiltinProfile(args.gpu.empty() ? "h200" : args.gpu);
  if (!profile.ok()) return Fail(context, "plan", profile.status());
  options.profile = *std::move(profile);
  options.stack = args.stack == "megatron"         ? planner::Stack::kMegatron
                  : args.stack == "megatron-naive" ? planner::Stack::kMegatronNaive
                                                   : planner::Stack::kHyScale;
  if (!args.calibration.empty()) {
    if (auto status = planner::LoadCalibration(args.calibration, &options.profile); !status.ok()) {
      return Fail(context, "plan", status);
    }
  }
  if (!args.key_sharing.empty()) {
    if (auto status = planner::ApplyKeySharing(args.key_sharing, &options.profile); !status.ok()) {
      return Fail(context, "plan",
                  absl::InvalidArgumentError(absl::StrCat("--key-sharing: ", status.message())));
    }
  }
  const planner::PlanResult plan = planner::PlanJob(spec, options);

  if (context.json()) {
    nlohmann::json out = {{"gpus", options.gpus},
                          {"profile", options.profile.name},
                          {"winner", plan.winner},
                          {"why", plan.why},
                          {"notes", plan.notes},
                          {"sources", options.profile.sources},
                          {"candidates", nlohmann::json::array()}};
    for (const auto& p : plan.candidates) out["candidates"].push_back(ToJson(p));
    if (!plan.stages.empty()) {
      out["stages"] = nlohmann::json::array();
      for (int i = 0; i < static_cast<int>(plan.stages.size()); ++i) {
        nlohmann::json stage = ToJson(plan.stages[i]);
        stage["name"] = spec.stages(i).name();
        stage["steps"] = spec.stages(i).steps();
        out["stages"].push_back(std::move(stage));
      }
      out["job_seconds"] = plan.job_seconds;
    }
    *context.out << out.dump(2) << "\n";
  } else {
    PrintTable(context, plan, args.top);
    for (const auto& line : plan.why) *context.out << "why: " << line << "\n";
    for (const auto& note : plan.notes) *context.out << "note: " << note << "\n";
    if (args.sources) {
      for (const auto& [figure, source] : options.profile.sources) {
        *context.out << "source: " << figure << ": " << source << "\n";
      }
    }
  }
  if (plan.winner < 0) {
    return Fail(context, "plan", absl::FailedPreconditionError(plan.why.front()));
  }
  return kExitOk;
}

}  // namespace

int Plan(const Context& context, const PlanArgs& args) {
  auto spec = LoadValidSpec(args.file);
  if (!spec.ok()) return Fail(context, "plan", spec.status());
  if (args.gpus > 0 || !args.gpu.empty() || !args.key_sharing.empty()) {
    hyscale::ApplyDefaults(&*spec);
    return PlanOffline(context, args, *spec);
  }
  auto kind = ParseDeviceKind(args.device);
  if (!kind.ok()) return Fail(context, "plan", kind.status());
  v1::PlanJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.mutable_resources()->set_ranks(args.ranks);
  request.mutable_resources()->set_device_kind(*kind);

  const auto planned = CallJobService(context, &v1::JobService::Stub::PlanJob, request);
  if (!planned.ok()) return Fail(context, "plan", planned.status());
  const v1::Plan& plan = *planned;
  if (context.json()) {
    PrintJson(context, plan);
    return kExitOk;
  }
  Table table({"FIELD", "VALUE"});
  table.AddRow({"feasible", plan.feasible() ? "yes" : absl::StrCat("no: ", plan.reason())});
  table.AddRow({"ranks", absl::StrCat(plan.ranks())});
  table.AddRow(
      {"context parallel", absl::StrCat(plan.context_parallel(), " (", plan.cp_layout(), ")")});
  table.AddRow({"query group", absl::StrCat(plan.query_group())});
  table.AddRow({"query chunk", plan.query_chunk() > 0 ? absl::StrCat(plan.query_chunk(), " queries")
                                                      : "whole sequence"});
  table.AddRow({"memory per rank", FormatBytes(plan.memory_bytes_per_rank())});
  table.AddRow({"step time", plan.step_seconds() > 0
                                 ? absl::StrFormat("%.3f s", plan.step_seconds())
                                 : "unknown (no profile)"});
  for (const auto& stage : plan.stages()) {
    table.AddRow(
        {absl::StrCat("stage ", stage.name()),
         absl::StrCat(
             Seconds(stage.step_seconds()), " a step x ", stage.steps(), ", ",
             FormatBytes(stage.memory_bytes_per_rank()),
             stage.query_chunk() > 0 ? absl::StrCat(", chunks of ", stage.query_chunk()) : "")});
  }
  if (plan.job_seconds() > 0) {
    table.AddRow({"job time", absl::StrFormat("%.0f s of steps (%.2f h)", plan.job_seconds(),
                                              plan.job_seconds() / 3600)});
  }
  for (const auto& placement : plan.placement()) {
    table.AddRow({absl::StrCat("rank ", placement.rank()),
                  absl::StrCat(placement.worker_id(), " device ", placement.device_index())});
  }
  table.Print(*context.out);
  for (const auto& note : plan.notes()) *context.out << "note: " << note << "\n";
  return kExitOk;
}

}  // namespace hyscale::cli
