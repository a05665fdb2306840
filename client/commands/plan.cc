#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include "client/commands/commands.h"
#include "client/format.h"

namespace hyscale::cli {

int Plan(const Context& context, const PlanArgs& args) {
  auto spec = LoadValidSpec(args.file);
  if (!spec.ok()) return Fail(context, "plan", spec.status());
  auto kind = ParseDeviceKind(args.device);
  if (!kind.ok()) return Fail(context, "plan", kind.status());
  v1::PlanJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.mutable_resources()->set_ranks(args.ranks);
  request.mutable_resources()->set_device_kind(*kind);

  auto stub = JobStub(context);
  if (!stub.ok()) return Fail(context, "plan", stub.status());
  v1::Plan plan;
  grpc::ClientContext call;
  rpc::PrepareCall(&call, context.client);
  if (auto status = (*stub)->PlanJob(&call, request, &plan); !status.ok()) {
    return Fail(context, "plan", status);
  }
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
  table.AddRow({"memory per rank", FormatBytes(plan.memory_bytes_per_rank())});
  table.AddRow({"step time", plan.step_seconds() > 0
                                 ? absl::StrFormat("%.3f s", plan.step_seconds())
                                 : "unknown (no profile)"});
  for (const auto& placement : plan.placement()) {
    table.AddRow({absl::StrCat("rank ", placement.rank()),
                  absl::StrCat(placement.worker_id(), " device ", placement.device_index())});
  }
  table.Print(*context.out);
  for (const auto& note : plan.notes()) *context.out << "note: " << note << "\n";
  return kExitOk;
}

}  // namespace hyscale::cli
