#include <absl/strings/str_cat.h>

#include <thread>

#include "client/commands/commands.h"
#include "client/format.h"
#include "client/watch_view.h"

namespace hyscale::cli {
namespace {

using Clock = std::chrono::steady_clock;

bool Terminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::OK;
}

}  // namespace

int WatchJob(const Context& context, v1::JobService::Stub& stub, const std::string& job_id) {
  WatchView view(context);
  int64_t after_sequence = 0;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  // The stream has no deadline (a job may train for days); keepalives catch a dead coordinator,
  // and a broken stream is resumed after the last event seen for up to --timeout.
  auto last_contact = Clock::now();
  while (true) {
    grpc::ClientContext call;
    rpc::PrepareCall(&call, context.client, std::chrono::milliseconds(0));
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_sequence(after_sequence);
    auto reader = stub.WatchJob(&call, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      last_contact = Clock::now();
      if (event.sequence() > 0 && event.sequence() <= after_sequence) continue;
      after_sequence = std::max(after_sequence, event.sequence());
      if (event.has_state_change()) {
        state = event.state_change().to();
        reason = event.state_change().reason();
      }
      view.Show(event);
    }
    const grpc::Status status = reader->Finish();
    if (Terminal(state)) break;
    if (!Transient(status.error_code())) {
      view.Finish();
      return Fail(context, "watch", status);
    }
    if (Clock::now() - last_contact > context.client.timeout) {
      view.Finish();
      return Fail(context, "watch",
                  status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                             "the event stream ended before the job did")
                              : status);
    }
    // Wait for the coordinator to be reachable again before reopening the stream: a stream
    // opened on a channel that is backing off fails at once with the old connection error.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    grpc::ClientContext probe;
    rpc::PrepareCall(&probe, context.client, context.client.timeout);
    probe.set_wait_for_ready(true);
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    v1::Job job;
    if (auto probed = stub.GetJob(&probe, get, &job); !Transient(probed.error_code())) {
      view.Finish();
      return Fail(context, "watch", probed);
    }
  }
  view.Finish();
  if (!context.json()) {
    *context.out << "job " << job_id << " " << StateName(state)
                 << (reason.empty() ? "" : ": " + Printable(reason)) << "\n"
                 << std::flush;
  }
  return state == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitJobFailed;
}

int Watch(const Context& context, const std::string& job_id) {
  auto stub = JobStub(context);
  if (!stub.ok()) return Fail(context, "watch", stub.status());
  return WatchJob(context, **stub, job_id);
}

}  // namespace hyscale::cli
