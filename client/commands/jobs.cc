// list, get and cancel: one call each, printed as a table or JSON.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>

#include "client/commands/commands.h"
#include "client/format.h"

namespace hyscale::cli {
namespace {

std::string Progress(const v1::Job& job) {
  const auto& progress = job.progress();
  if (progress.total_steps() <= 0) return "-";
  return absl::StrFormat(
      "%d/%d (%.0f%%)", progress.step(), progress.total_steps(),
      100.0 * static_cast<double>(progress.step()) / static_cast<double>(progress.total_steps()));
}

int Ranks(const v1::Job& job) {
  return std::max(1, job.resources().ranks());
}

// The restarts that used max_restarts, and the attempts a worker ended (a start it missed, or
// its leaving), which did not.
std::string Restarts(const v1::Job& job) {
  const int uncounted = job.start_timeouts() + job.disruptions();
  std::string text = absl::StrCat(job.restarts() - uncounted, " of ", job.max_restarts());
  if (uncounted > 0) {
    absl::StrAppend(&text, "; ", uncounted, " more not counted (", job.disruptions(),
                    " worker left or lost, ", job.start_timeouts(), " start timed out)");
  }
  return text;
}

void PrintJob(const Context& context, const v1::Job& job) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  const auto& progress = job.progress();
  Table table({"FIELD", "VALUE"});
  table.AddRow({"id", job.id()});
  table.AddRow({"name", job.name()});
  table.AddRow({"state", StateName(job.state())});
  if (!job.reason().empty()) table.AddRow({"reason", job.reason()});
  table.AddRow({"priority", absl::StrCat(job.priority())});
  table.AddRow({"restarts", Restarts(job)});
  table.AddRow(
      {"resources",
       absl::StrCat(Ranks(job), " ranks, ", DeviceKindName(job.resources().device_kind()),
                    job.resources().memory_bytes_per_rank() > 0
                        ? absl::StrCat(", ", FormatBytes(job.resources().memory_bytes_per_rank()),
                                       " per rank")
                        : "")});
  table.AddRow({"progress", Progress(job)});
  if (progress.total_steps() > 0) {
    table.AddRow({"stage", absl::StrCat(progress.stage())});
    table.AddRow({"loss", absl::StrFormat("%.4f", progress.loss())});
    table.AddRow({"tokens/s", FormatRate(progress.tokens_per_second())});
    table.AddRow({"eta", FormatDuration(progress.eta_seconds())});
    if (progress.accuracy() > 0 || progress.indexer_recall() > 0) {
      table.AddRow({"accuracy", absl::StrFormat("%.3f", progress.accuracy())});
      table.AddRow({"indexer recall", absl::StrFormat("%.3f", progress.indexer_recall())});
    }
  }
  if (!job.rendezvous().empty()) table.AddRow({"rendezvous", job.rendezvous()});
  for (const auto& placement : job.placement()) {
    table.AddRow({absl::StrCat("rank ", placement.rank()),
                  absl::StrCat(placement.worker_id(), " device ", placement.device_index(),
                               placement.device_name().empty()
                                   ? ""
                                   : absl::StrCat(" (", placement.device_name(), ")"))});
  }
  table.AddRow({"created", absl::StrCat(FormatTimestamp(job.created_at()), " (",
                                        FormatAge(job.created_at(), now), " ago)")});
  table.AddRow({"started", FormatTimestamp(job.started_at())});
  table.AddRow({"finished", FormatTimestamp(job.finished_at())});
  table.AddRow({"request id", job.request_id().empty() ? "-" : job.request_id()});
  table.Print(*context.out);
}

}  // namespace

int List(const Context& context, const std::vector<std::string>& states) {
  v1::ListJobsRequest request;
  for (const auto& text : states) {
    auto state = ParseState(text);
    if (!state.ok()) return Fail(context, "list", state.status());
    request.add_states(*state);
  }
  auto stub = JobStub(context);
  if (!stub.ok()) return Fail(context, "list", stub.status());
  v1::ListJobsResponse all;
  if (auto status = ReadEveryPage(context, **stub, &v1::JobService::Stub::ListJobs, request, &all);
      !status.ok()) {
    return Fail(context, "list", status);
  }

  if (context.json()) {
    PrintJson(context, all);
    return kExitOk;
  }
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  Table table({"ID", "NAME", "STATE", "PRIORITY", "RANKS", "PROGRESS", "LOSS", "AGE", "REASON"});
  for (const auto& job : all.jobs()) {
    table.AddRow(
        {job.id(), job.name(), StateName(job.state()), absl::StrCat(job.priority()),
         absl::StrCat(Ranks(job)), Progress(job),
         job.progress().total_steps() > 0 ? absl::StrFormat("%.4f", job.progress().loss()) : "-",
         FormatAge(job.created_at(), now), job.reason()});
  }
  table.Print(*context.out);
  return kExitOk;
}

int Get(const Context& context, const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  const auto job = CallJobService(context, &v1::JobService::Stub::GetJob, request);
  if (!job.ok()) return Fail(context, "get", job.status());
  if (context.json()) {
    PrintJson(context, *job);
  } else {
    PrintJob(context, *job);
  }
  return kExitOk;
}

int Cancel(const Context& context, const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  const auto job = CallJobService(context, &v1::JobService::Stub::CancelJob, request);
  if (!job.ok()) return Fail(context, "cancel", job.status());
  if (context.json()) {
    PrintJson(context, *job);
  } else {
    *context.out << "job " << job->id() << " " << StateName(job->state())
                 << (job->reason().empty() ? "" : ": " + Printable(job->reason())) << "\n";
  }
  return kExitOk;
}

}  // namespace hyscale::cli
