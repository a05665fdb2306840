#include "server/web_ui.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "proto/events.h"
#include "proto/rpc.h"
#include "server/web_assets.h"

namespace hyscale::server {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";

// Reasons and names may hold bytes that are not UTF-8 (a trainer's stderr, say): replaced, not
// thrown on.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

HttpResponse Error(int status, const std::string& message) {
  return {status, kJson, Dump(json{{"error", message}})};
}

// "JOB_STATE_RUNNING" -> "running", as the metrics and the CLI spell states.
std::string StateLabel(v1::JobState state) {
  std::string label = v1::JobState_Name(state).substr(10);
  for (char& c : label) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return label;
}

double Seconds(const google::protobuf::Timestamp& stamp) {
  return static_cast<double>(stamp.seconds()) + stamp.nanos() * 1e-9;
}

json JobRow(const v1::Job& job) {
  const v1::JobProgress& progress = job.progress();
  return {{"id", job.id()},
          {"name", job.name()},
          {"state", StateLabel(job.state())},
          {"reason", job.reason()},
          {"restarts", job.restarts()},
          {"ranks", job.resources().ranks()},
          {"rendezvous", job.rendezvous()},
          {"step", progress.step()},
          {"total_steps", progress.total_steps()},
          {"loss", progress.loss()},
          {"tokens_per_second", progress.tokens_per_second()},
          {"eta_seconds", progress.eta_seconds()},
          {"indexer_recall", progress.indexer_recall()},
          {"created_at", Seconds(job.created_at())},
          {"updated_at", Seconds(job.updated_at())}};
}

json StepRow(const v1::TrainerEventLine::Step& step) {
  json phases = json::object();
  for (const auto& [phase, seconds] : step.phase_seconds()) phases[phase] = seconds;
  json row = {{"step", step.step()},
              {"loss", step.loss()},
              {"step_seconds", step.step_seconds()},
              {"tokens_per_second", step.tokens_per_second()},
              {"phases", std::move(phases)}};
  if (step.has_evaluation()) row["indexer_recall"] = step.evaluation().indexer_recall();
  return row;
}

}  // namespace

WebUi::WebUi(Coordinator* coordinator, rpc::ServerTokens tokens)
    : coordinator_(coordinator), tokens_(std::move(tokens)) {}

void WebUi::Mount(MetricsHttpServer* http) const {
  http->Get("/", [](const HttpRequest&) {
    return HttpResponse{200, "text/html; charset=utf-8", web::kIndexHtml};
  });
  http->Get("/app.js", [](const HttpRequest&) {
    return HttpResponse{200, "text/javascript; charset=utf-8", web::kAppJs};
  });
  http->Get("/api/v1/jobs", [this](const HttpRequest& request) { return Jobs(request); });
  http->Get("/api/v1/job", [this](const HttpRequest& request) { return Job(request); });
}

HttpResponse WebUi::Jobs(const HttpRequest& request) const {
  if (!rpc::Authorized(request.authorization, tokens_, rpc::Access::kRead))
    return Error(401, "authorization: bearer token required");
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  auto jobs = coordinator_->ListJobs(list);
  if (!jobs.ok()) return Error(500, std::string(jobs.status().message()));
  json rows = json::array();
  for (const auto& job : jobs->jobs()) rows.push_back(JobRow(job));
  return {200, kJson, Dump(json{{"jobs", std::move(rows)}})};
}

HttpResponse WebUi::Job(const HttpRequest& request) const {
  if (!rpc::Authorized(request.authorization, tokens_, rpc::Access::kRead))
    return Error(401, "authorization: bearer token required");
  const auto id = request.params.find("id");
  if (id == request.params.end() || id->second.empty()) return Error(400, "id: required");
  int64_t after = 0;
  if (const auto found = request.params.find("after"); found != request.params.end()) {
    if (!absl::SimpleAtoi(found->second, &after) || after < 0) {
      return Error(
          400, absl::StrCat("after: expected an event sequence >= 0 (got '", found->second, "')"));
    }
  }
  auto job = coordinator_->GetJob(id->second);
  if (!job.ok()) return Error(404, absl::StrCat("job not found: ", id->second));
  auto events = coordinator_->JobEvents(id->second, after, kEventsPerPoll);
  if (!events.ok()) {
    return Error(absl::IsNotFound(events.status()) ? 404 : 500,
                 std::string(events.status().message()));
  }
  json steps = json::array();
  json states = json::array();
  for (const auto& event : *events) {
    after = event.sequence();
    const v1::TrainerEvent& trainer = event.trainer();
    if (trainer.rank() == 0 && trainer.event().has_step()) {
      steps.push_back(StepRow(trainer.event().step()));
    }
    if (event.has_state_change()) {
      states.push_back({{"time", Seconds(event.time())},
                        {"state", StateLabel(event.state_change().to())},
                        {"reason", event.state_change().reason()}});
    }
    if (event.has_replanned()) {  // listed with the states: why a waiting job runs another plan
      states.push_back({{"time", Seconds(event.time())},
                        {"state", "re-planned"},
                        {"reason", event.replanned().reason()}});
    }
  }
  const bool more = static_cast<int>(events->size()) == kEventsPerPoll;
  return {200, kJson,
          Dump(json{{"job", JobRow(*job)},
                    {"steps", std::move(steps)},
                    {"phase_order", PhaseNames()},
                    {"states", std::move(states)},
                    {"after", after},
                    {"more", more}})};
}

}  // namespace hyscale::server
