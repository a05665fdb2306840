#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>

#include "client/commands/commands.h"
#include "client/format.h"

namespace hyscale::cli {

int Workers(const Context& context) {
  auto stub = WorkerStub(context);
  if (!stub.ok()) return Fail(context, "workers", stub.status());
  v1::ListWorkersResponse response;
  if (auto status =
          ReadEveryPage(context, **stub, &v1::WorkerService::Stub::ListWorkers, {}, &response);
      !status.ok()) {
    return Fail(context, "workers", status);
  }
  if (context.json()) {
    PrintJson(context, response);
    return kExitOk;
  }
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  Table table({"ID", "ADDRESS", "STATE", "DEVICES", "RUNNING", "LAST HEARTBEAT"});
  for (const auto& worker : response.workers()) {
    std::vector<std::string> running;
    for (const auto& ref : worker.running()) {
      running.push_back(absl::StrCat(ref.job_id(), "/", ref.rank()));
    }
    // An excluded worker (a rank placed on it did not start in time) gets no placements yet.
    const std::string state =
        worker.has_unhealthy_until()
            ? absl::StrCat(WorkerStateName(worker.state()), " (excluded until ",
                           FormatTimestamp(worker.unhealthy_until()), ")")
            : WorkerStateName(worker.state());
    table.AddRow({worker.id(), worker.address(), state, FormatDevices(worker.devices()),
                  running.empty() ? "-" : absl::StrJoin(running, ","),
                  absl::StrCat(FormatAge(worker.last_heartbeat(), now), " ago")});
  }
  table.Print(*context.out);
  return kExitOk;
}

}  // namespace hyscale::cli
