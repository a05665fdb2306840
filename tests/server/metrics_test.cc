#include "server/metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>

#include "server/metrics_http.h"
#include "server/server_metrics.h"
#include "util/subprocess.h"
#include "util/temp_dir.h"

namespace hyscale::server {
namespace {

// Runs `promtool check metrics` on `text`; returns its exit code and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  const util::TempDir dir = util::TempDir::Create("hyscale_metrics").value();
  std::ofstream(dir.Path("metrics.txt")) << text;
  util::Command command(
      {"/bin/sh", "-c", "exec /usr/bin/promtool check metrics < " + dir.Path("metrics.txt")});
  command.stderr_to = util::Redirect::ToStdout();
  const auto run = util::RunAndCapture(std::move(command));
  if (!run.ok()) return {-1, run.status().ToString()};
  return {run->exit.ShellCode(), run->output};
}

TEST(MetricsTest, EscapingFollowsTheTextFormat) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeHelp("x\\y\nz\""), "x\\\\y\\nz\"");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
}

TEST(MetricsTest, RegistryRendersCountersGaugesHistograms) {
  MetricsRegistry registry;
  auto* counter = registry.AddCounter("test_requests_total", "Requests.", {"method"});
  auto* gauge = registry.AddGauge("test_temperature_celsius", "A \"gauge\".\nTwo lines.");
  auto* histogram = registry.AddHistogram("test_latency_seconds", "Latency.", {"job"}, {0.1, 1});
  counter->Inc({"Get"});
  counter->Inc({"Get"}, 2);
  gauge->Set({}, 21.5);
  histogram->Observe({"a\"b"}, 0.05);
  histogram->Observe({"a\"b"}, 0.5);
  histogram->Observe({"a\"b"}, 5);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("test_requests_total{method=\"Get\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("test_temperature_celsius 21.5\n"), std::string::npos);
  EXPECT_NE(text.find("test_latency_seconds_bucket{job=\"a\\\"b\",le=\"0.1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("test_latency_seconds_bucket{job=\"a\\\"b\",le=\"1\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("test_latency_seconds_bucket{job=\"a\\\"b\",le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("test_latency_seconds_count{job=\"a\\\"b\"} 3\n"), std::string::npos);
  const auto [status, output] = Promtool(text);
  EXPECT_EQ(status, 0) << output << text;
  registry.RemoveWhere("job", "a\"b");
  EXPECT_EQ(registry.Render().find("test_latency_seconds_bucket"), std::string::npos);
}

TEST(MetricsTest, ServerMetricsPassPromtool) {
  ServerMetrics metrics(absl::Minutes(1));
  metrics.SetJobCounts({{v1::JOB_STATE_RUNNING, 2}});
  metrics.SetWorkerCounts({{v1::WORKER_STATE_ONLINE, 1}});
  metrics.JobSubmitted();
  metrics.JobScheduled(0.2);
  metrics.Rpc("hyscale.v1.JobService/SubmitJob", "OK", 0.003);
  v1::TrainerEventLine::Step step;
  step.set_step(10);
  step.set_step_seconds(0.4);
  step.set_loss(2.0);
  step.set_tokens_per_second(1000);
  step.set_peak_memory_bytes(1 << 20);
  step.mutable_evaluation()->set_indexer_recall(0.75);
  for (const auto& [group, ratio] :
       {std::pair{4, 1.5}, std::pair{3, 9.0}, std::pair{1 << 20, 9.0}}) {
    auto* shared = step.mutable_evaluation()->add_key_sharing();
    shared->set_group(group);
    shared->set_selected_per_distinct(ratio);
  }
  (*step.mutable_phase_seconds())["selection_fwd"] = 0.1;
  (*step.mutable_phase_seconds())["attention_fwd"] = 0.2;
  step.mutable_comm()->set_exposed(0.01);
  step.mutable_comm()->set_overlapped(0.03);
  metrics.Step("job-1", step);
  metrics.JobPlanned("job-1", 3 << 20, 0.5);
  metrics.StagePredicted("job-1", 2 << 20, 0.25);  // the stage's own replace the job's
  const std::string text = metrics.Render();
  for (const char* name :
       {"hyscale_jobs{state=\"running\"} 2", "hyscale_job_submissions_total 1",
        "hyscale_scheduling_latency_seconds_count 1",
        "hyscale_rpc_requests_total{method=\"hyscale.v1.JobService/SubmitJob\",code=\"OK\"} 1",
        "hyscale_rpc_duration_seconds_count{method=\"hyscale.v1.JobService/SubmitJob\"} 1",
        "hyscale_workers{state=\"online\"} 1", "hyscale_workers{state=\"lost\"} 0",
        "hyscale_job_step_phase_seconds_bucket{job_id=\"job-1\",phase=\"selection_fwd\",le=\"0.1\"}"
        " 1",
        "hyscale_job_step_seconds_count{job_id=\"job-1\"} 1",
        "hyscale_job_comm_seconds_count{job_id=\"job-1\",kind=\"exposed\"} 1",
        "hyscale_job_comm_seconds_count{job_id=\"job-1\",kind=\"overlapped\"} 1",
        "hyscale_job_tokens_per_second{job_id=\"job-1\"} 1000",
        "hyscale_job_loss{job_id=\"job-1\"} 2", "hyscale_job_indexer_recall{job_id=\"job-1\"} 0.75",
        "hyscale_job_key_sharing{job_id=\"job-1\",group=\"4\"} 1.5",
        "hyscale_job_peak_memory_bytes{job_id=\"job-1\"} 1048576",
        "hyscale_job_predicted_memory_bytes{job_id=\"job-1\"} 2097152",
        "hyscale_job_predicted_step_seconds{job_id=\"job-1\"} 0.25",
        "hyscale_job_step{job_id=\"job-1\"} 10"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
  // Only the trainer's G (2, 4, .., 64) become label values.
  EXPECT_EQ(text.find("group=\"3\""), std::string::npos);
  EXPECT_EQ(text.find("group=\"1048576\""), std::string::npos);
  const auto [status, output] = Promtool(text);
  EXPECT_EQ(status, 0) << output << text;

  metrics.JobEnded("job-1", absl::FromUnixSeconds(100));
  metrics.Expire(absl::FromUnixSeconds(130));
  EXPECT_NE(metrics.Render().find("job-1"), std::string::npos);
  metrics.Expire(absl::FromUnixSeconds(161));
  EXPECT_EQ(metrics.Render().find("job-1"), std::string::npos);
}

// Label values a worker or a queue could grow without bound are not exported: phase names the
// trainer does not use, and per-job series of jobs that only wait.
TEST(MetricsTest, PerJobSeriesStayBounded) {
  ServerMetrics metrics(absl::Minutes(1));
  v1::TrainerEventLine::Step step;
  (*step.mutable_phase_seconds())["mlp_bwd"] = 0.1;
  (*step.mutable_phase_seconds())["forward"] = 0.1;
  (*step.mutable_phase_seconds())["Bad-Name"] = 0.1;
  for (int i = 0; i < 40; ++i) (*step.mutable_phase_seconds())["p" + std::to_string(i)] = 0.1;
  metrics.Step("job-1", step);
  const std::string text = metrics.Render();
  EXPECT_NE(text.find("phase=\"mlp_bwd\""), std::string::npos);
  EXPECT_EQ(text.find("phase=\"forward\""), std::string::npos);
  EXPECT_EQ(text.find("Bad-Name"), std::string::npos);
  EXPECT_EQ(text.find("phase=\"p0\""), std::string::npos);
  metrics.JobState("job-queued", v1::JOB_STATE_PENDING);
  EXPECT_EQ(metrics.Render().find("job-queued"), std::string::npos);
}

TEST(MetricsTest, ServedOverHttp) {
  MetricsHttpServer server([] { return std::string("x_total 1\n"); });
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client client("127.0.0.1", *port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "x_total 1\n");
  EXPECT_EQ(response->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  server.Stop();
}

TEST(MetricsTest, HostPortParsing) {
  EXPECT_EQ(*SplitHostPort("127.0.0.1:9464", "x"), std::make_pair(std::string("127.0.0.1"), 9464));
  EXPECT_EQ(SplitHostPort("[::1]:0", "x")->first, "::1");
  EXPECT_FALSE(SplitHostPort("nope", "metrics_listen").ok());
  EXPECT_FALSE(SplitHostPort("h:70000", "metrics_listen").ok());
}

}  // namespace
}  // namespace hyscale::server
