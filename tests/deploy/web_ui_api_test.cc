// The web view's JSON (server/web_ui.h) and the per-job series added for the dashboards and
// alerts (running, restarts, predicted memory), on an in-process coordinator with a fake clock.
#include "server/web_ui.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/server/test_util.h"

namespace hyscale::server {
namespace {

using nlohmann::json;

class WebUiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.data_dir = testing::ScratchDir();
    options.restart_backoff = absl::Seconds(1);
    auto coordinator = Coordinator::Open(options, &clock_, &metrics_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    c_ = std::move(*coordinator);
  }

  // A job RUNNING on worker w1 with two reported steps of rank 0 (and one of rank 1, ignored).
  std::string RunningJob(int max_restarts) {
    auto job = c_->SubmitJob(testing::SubmitRequest(1, 0, max_restarts));
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(c_->RegisterWorker(testing::WorkerRequest("w1", 1)).ok());
    ref_.set_job_id(job->id());
    ref_.set_rank(0);
    ref_.set_attempt(0);
    v1::RankReport started;
    *started.mutable_ref() = ref_;
    started.set_started_pid(42);
    Report(started);
    for (const char* line :
         {R"({"step":{"step":1,"loss":3.5,"step_seconds":0.2,
              "phase_seconds":{"selection_fwd":0.05,"comm_fwd":0.01}}})",
          R"({"checkpoint_written":{"step":1}})",
          R"({"step":{"step":2,"loss":3.0,"step_seconds":0.2,"evaluation":{"indexer_recall":0.9},
              "phase_seconds":{"selection_fwd":0.04,"comm_fwd":0.02}}})"}) {
      v1::RankReport event;
      *event.mutable_ref() = ref_;
      event.set_event_json(line);
      Report(event);
    }
    return job->id();
  }

  void Report(const v1::RankReport& report) {
    v1::ReportStatusRequest request;
    request.set_worker_id("w1");
    *request.add_reports() = report;
    ASSERT_TRUE(c_->ReportStatus(request).ok());
  }

  static json Body(const HttpResponse& response) {
    EXPECT_EQ(response.content_type, "application/json");
    return json::parse(response.body);
  }

  FakeClock clock_;
  ServerMetrics metrics_{absl::Minutes(10)};
  std::unique_ptr<Coordinator> c_;
  v1::RankRef ref_;
};

TEST_F(WebUiTest, ListsJobsAndPollsTheirSteps) {
  const std::string id = RunningJob(0);
  const WebUi ui(c_.get(), {});
  const HttpResponse list = ui.Jobs({});
  ASSERT_EQ(list.status, 200) << list.body;
  const json jobs = Body(list)["jobs"];
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["id"], id);
  EXPECT_EQ(jobs[0]["state"], "running");
  EXPECT_EQ(jobs[0]["step"], 2);

  const HttpResponse detail = ui.Job({{{"id", id}}, ""});
  ASSERT_EQ(detail.status, 200) << detail.body;
  const json body = Body(detail);
  ASSERT_EQ(body["steps"].size(), 2u);
  EXPECT_EQ(body["steps"][0]["phases"]["selection_fwd"], 0.05);
  EXPECT_EQ(body["phase_order"][0], "data");  // the chart stacks the phases in step order
  EXPECT_EQ(body["steps"][1]["loss"], 3.0);
  EXPECT_EQ(body["steps"][1]["indexer_recall"], 0.9);
  EXPECT_FALSE(body["steps"][0].contains("indexer_recall"));
  EXPECT_EQ(body["states"].back()["state"], "running");
  EXPECT_FALSE(body["more"]);

  // Polling from the last sequence seen returns nothing new, and the same sequence again.
  const std::string after = std::to_string(body["after"].get<int64_t>());
  const json again = Body(ui.Job({{{"id", id}, {"after", after}}, ""}));
  EXPECT_TRUE(again["steps"].empty());
  EXPECT_EQ(again["after"], body["after"]);
}

TEST_F(WebUiTest, BadParametersAreJsonErrors) {
  const std::string id = RunningJob(0);
  const WebUi ui(c_.get(), {});
  for (const char* after : {"-1", "x", "1.5", "99999999999999999999"}) {
    const HttpResponse response = ui.Job({{{"id", id}, {"after", after}}, ""});
    EXPECT_EQ(response.status, 400) << after;
    EXPECT_EQ(Body(response)["error"].get<std::string>().rfind("after:", 0), 0u) << response.body;
  }
  const HttpResponse unknown = ui.Job({{{"id", "job-nope"}}, ""});
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(Body(unknown)["error"], "job not found: job-nope");
  EXPECT_EQ(ui.Job({}).status, 400);
}

TEST_F(WebUiTest, TokenGuardsTheJson) {
  RunningJob(0);
  const WebUi ui(c_.get(), {"s3cret", "r3ad"});
  EXPECT_EQ(ui.Jobs({}).status, 401);
  EXPECT_EQ(ui.Jobs({{}, "Bearer r3ad"}).status, 200);  // the read-only token reads
  EXPECT_EQ(ui.Jobs({{}, "Bearer wrong"}).status, 401);
  EXPECT_EQ(ui.Jobs({{}, "s3cret"}).status, 401);
  EXPECT_EQ(ui.Job({{{"id", "x"}}, "Bearer s3cre"}).status, 401);
  EXPECT_EQ(ui.Jobs({{}, "Bearer s3cret"}).status, 200);
}

TEST_F(WebUiTest, ExportsRunningRestartsAndPredictedMemory) {
  const std::string id = RunningJob(1);
  const std::string label = "{job_id=\"" + id + "\"}";
  std::string text = metrics_.Render();
  EXPECT_NE(text.find("hyscale_job_running" + label + " 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("hyscale_job_predicted_memory_bytes" + label + " "), std::string::npos);
  EXPECT_NE(text.find("hyscale_job_restarts_total" + label + " 0\n"), std::string::npos) << text;

  v1::RankReport exited;
  *exited.mutable_ref() = ref_;
  exited.mutable_exited()->set_exit_code(1);
  Report(exited);
  ASSERT_EQ(c_->GetJob(id)->state(), v1::JOB_STATE_RESTARTING);
  text = metrics_.Render();
  EXPECT_NE(text.find("hyscale_job_running" + label + " 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("hyscale_job_restarts_total" + label + " 1\n"), std::string::npos) << text;

  const std::string path = testing::ScratchDir() + "/metrics.txt";
  std::ofstream(path) << text;
  EXPECT_EQ(std::system(("promtool check metrics < " + path).c_str()), 0) << text;
}

}  // namespace
}  // namespace hyscale::server
