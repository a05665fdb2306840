// libFuzzer target: what the coordinator takes from clients and workers before any state changes.
// The first byte picks what the rest is:
//   0      a trainer event line as an agent forwards it (RankReport.event_json): ParseTrainerEvent,
//          RendezvousAddress, and that what was read writes back as a line that reads the same
//   1..N   a serialized request of the API (SubmitJobRequest, ReportStatusRequest, ...): the field
//          size caps (CheckFieldSizes), then what the coordinator reads from it first: the job
//          spec's defaults and validation, every report's event line
// Besides "no crash, hang or leak" it checks the contracts the headers promise, aborting (a
// finding) when one breaks.
#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hyscale/v1/service.pb.h"
#include "proto/events.h"
#include "proto/job_spec.h"
#include "server/request_limits.h"
#include "server/trainer_events.h"

namespace {

using hyscale::v1::JobSpec;

void Require(bool ok, const char* contract) {
  if (ok) return;
  std::fprintf(stderr, "request contract broken: %s\n", contract);
  std::abort();
}

void RequireInvalidArgument(const absl::Status& status, const char* what) {
  Require(absl::IsInvalidArgument(status), what);
  Require(!status.message().empty(), "errors carry a message");
}

void CheckEventLine(const std::string& line) {
  const auto event = hyscale::server::ParseTrainerEvent(0, line);
  if (!event.ok()) {
    RequireInvalidArgument(event.status(), "a bad event line is INVALID_ARGUMENT");
    return;
  }
  const hyscale::v1::TrainerEventLine& read = event->trainer().event();
  const auto written = hyscale::FormatEventLine(read);
  Require(written.ok(), "an event line read can be written");
  const auto again = hyscale::ParseEventLine(*written);
  Require(again.ok() && google::protobuf::util::MessageDifferencer::Equals(*again, read),
          "an event line written reads back the same");
  if (!read.has_rendezvous()) return;
  const auto address = hyscale::server::RendezvousAddress(read.rendezvous());
  if (!address.ok()) {
    RequireInvalidArgument(address.status(), "a bad rendezvous is INVALID_ARGUMENT");
    return;
  }
  Require(!address->empty() && address->find(':') != std::string::npos,
          "a rendezvous address is host:port");
}

void CheckSpec(const JobSpec& spec) {
  JobSpec defaulted = spec;
  hyscale::ApplyDefaults(&defaulted);
  const absl::Status verdict = hyscale::ValidateJobSpec(spec);
  if (!verdict.ok()) RequireInvalidArgument(verdict, "a bad spec is INVALID_ARGUMENT");
}

// One request type: a fresh message and what the coordinator reads from it after the caps.
struct RequestKind {
  std::function<std::unique_ptr<google::protobuf::Message>()> make;
  std::function<void(const google::protobuf::Message&)> read;
};

template <typename Request>
RequestKind Kind(std::function<void(const Request&)> read = nullptr) {
  return {[] { return std::make_unique<Request>(); },
          [read](const google::protobuf::Message& message) {
            if (read) read(static_cast<const Request&>(message));
          }};
}

const std::vector<RequestKind>& Kinds() {
  namespace v1 = hyscale::v1;
  static const auto* kinds = new std::vector<RequestKind>{
      Kind<v1::SubmitJobRequest>([](const auto& r) { CheckSpec(r.spec()); }),
      Kind<v1::PlanJobRequest>([](const auto& r) { CheckSpec(r.spec()); }),
      Kind<v1::ReportStatusRequest>([](const auto& r) {
        for (const auto& report : r.reports()) {
          if (report.has_event_json()) CheckEventLine(report.event_json());
        }
      }),
      Kind<v1::GetJobRequest>(),
      Kind<v1::ListJobsRequest>(),
      Kind<v1::CancelJobRequest>(),
      Kind<v1::WatchJobRequest>(),
      Kind<v1::StreamLogsRequest>(),
      Kind<v1::RegisterWorkerRequest>(),
      Kind<v1::HeartbeatRequest>(),
      Kind<v1::StreamAssignmentsRequest>(),
      Kind<v1::ListWorkersRequest>(),
  };
  return *kinds;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t pick = data[0] % (Kinds().size() + 1);
  if (pick == 0) {
    CheckEventLine(rest);
    return 0;
  }
  const RequestKind& kind = Kinds()[pick - 1];
  auto request = kind.make();
  if (!request->ParseFromString(rest)) return 0;
  const absl::Status caps = hyscale::server::CheckFieldSizes(*request);
  if (!caps.ok()) {
    RequireInvalidArgument(caps, "an oversized field is INVALID_ARGUMENT");
    Require(caps.message().find("exceeds the limit of") != std::string::npos,
            "the cap error names the field and its limit");
    return 0;
  }
  kind.read(*request);
  return 0;
}
