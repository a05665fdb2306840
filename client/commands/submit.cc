#include <absl/strings/str_cat.h>

#include "client/commands/commands.h"
#include "client/format.h"

namespace hyscale::cli {

int Submit(const Context& context, const SubmitArgs& args,
           const std::function<void(const std::string& job_id)>& on_submitted) {
  auto spec = LoadValidSpec(args.file);
  if (!spec.ok()) return Fail(context, "submit", spec.status());
  auto kind = ParseDeviceKind(args.device);
  if (!kind.ok()) return Fail(context, "submit", kind.status());

  v1::SubmitJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.mutable_resources()->set_ranks(args.ranks);
  request.mutable_resources()->set_device_kind(*kind);
  request.set_priority(args.priority);
  request.set_max_restarts(args.max_restarts);
  request.set_request_id(args.request_id.empty() ? RandomRequestId() : args.request_id);

  auto stub = JobStub(context);
  if (!stub.ok()) return Fail(context, "submit", stub.status());
  const auto submitted = CallUnary(context, **stub, &v1::JobService::Stub::SubmitJob, request);
  if (!submitted.ok()) return Fail(context, "submit", submitted.status());
  const v1::Job& job = *submitted;
  if (on_submitted) on_submitted(job.id());
  if (context.json()) {
    // With --watch the job is the first JSON line, its events the following ones.
    PrintJson(context, job, /*one_line=*/args.watch);
  } else {
    *context.out << "job " << job.id() << " submitted (" << Printable(job.name()) << ", "
                 << StateName(job.state()) << ")\n"
                 << std::flush;
  }
  return args.watch ? WatchJob(context, **stub, job.id()) : kExitOk;
}

}  // namespace hyscale::cli
