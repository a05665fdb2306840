#include "client/cli.h"
#include "tests/client/tiny_spec.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/client/fake_job_service.h"
#include "tests/client/tiny_spec.h"
#include "util/temp_dir.h"

namespace hyscale::cli {
namespace {

using nlohmann::json;
using testing::FakeServer;

struct Result {
  int code;
  std::string out;
  std::string err;
};

constexpr const char* kSpec = hyscale::cli::testing::kTinySpec;

class CliTest : public ::testing::Test {
 protected:
  CliTest() {
    spec_ = Write("job.yaml", kSpec);
    unsetenv("HYSCALE_TOKEN");
    unsetenv("HYSCALE_SERVER");
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.Path(name);
    std::ofstream(path) << text;
    return path;
  }

  // Runs hyscale against the fake server with the given arguments after the global flags.
  Result Run(std::vector<std::string> args) {
    std::vector<std::string> full = {"--server", server_.address(), "--timeout", "5"};
    full.insert(full.end(), args.begin(), args.end());
    return RunRaw(full);
  }
  static Result RunRaw(const std::vector<std::string>& args) {
    std::ostringstream out, err;
    const int code = RunCli(args, out, err);
    return {code, out.str(), err.str()};
  }

  std::string Submit(const std::string& request_id = "") {
    std::vector<std::string> args = {"-o", "json", "submit", "-f", spec_};
    if (!request_id.empty()) args.insert(args.end(), {"--request-id", request_id});
    const Result result = Run(args);
    EXPECT_EQ(result.code, 0) << result.err;
    return json::parse(result.out).at("id").get<std::string>();
  }

  const util::TempDir dir_ = util::TempDir::Create("hyscale-cli").value();
  std::string spec_;
  FakeServer server_;
};

v1::JobEvent StateEvent(int64_t sequence, v1::JobState from, v1::JobState to,
                        const std::string& reason = "") {
  v1::JobEvent event;
  event.set_sequence(sequence);
  event.mutable_state_change()->set_from(from);
  event.mutable_state_change()->set_to(to);
  event.mutable_state_change()->set_reason(reason);
  return event;
}

v1::JobEvent StepEvent(int64_t sequence, int64_t step) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  auto* figures = event.mutable_trainer()->mutable_event()->mutable_step();
  figures->set_step(step);
  figures->set_total_steps(20);
  figures->set_loss(1.25);
  (*figures->mutable_phase_seconds())["selection_fwd"] = 0.5;
  return event;
}

TEST_F(CliTest, SubmitPrintsJobAsJson) {
  const Result result = Run({"-o", "json", "submit", "-f", spec_, "--ranks", "2", "--priority", "5",
                             "--max-restarts", "1", "--device", "cpu", "--request-id", "req-1"});
  ASSERT_EQ(result.code, 0) << result.err;
  const json job = json::parse(result.out);
  EXPECT_EQ(job["id"], "job-1");
  EXPECT_EQ(job["name"], "tiny");
  EXPECT_EQ(job["state"], "JOB_STATE_PENDING");
  EXPECT_EQ(job["request_id"], "req-1");
  EXPECT_EQ(job["priority"], 5);
  EXPECT_EQ(job["max_restarts"], 1);
  EXPECT_EQ(job["resources"]["ranks"], 2);
  EXPECT_EQ(job["resources"]["device_kind"], "DEVICE_KIND_CPU");
  EXPECT_EQ(job["spec"]["model"]["d_model"], 32);
}

TEST_F(CliTest, SubmitRetryWithSameRequestIdIsIdempotent) {
  EXPECT_EQ(Submit("same"), Submit("same"));
  const std::string other = Submit();
  EXPECT_NE(other, Submit());
  const auto submissions = server_.jobs().submissions();
  ASSERT_EQ(submissions.size(), 4u);
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  EXPECT_TRUE(std::regex_match(submissions[2].request_id(), uuid)) << submissions[2].request_id();
  EXPECT_NE(submissions[2].request_id(), submissions[3].request_id());
}

TEST_F(CliTest, SubmitTableOutput) {
  const Result result = Run({"submit", "-f", spec_});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.out, "job job-1 submitted (tiny, PENDING)\n");
}

TEST_F(CliTest, SubmitInvalidSpecNamesTheFieldAndSendsNothing) {
  const std::string bad = Write("bad.yaml", std::string(kSpec) + "log_every: -3\n");
  const Result result = Run({"submit", "-f", bad});
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("log_every"), std::string::npos) << result.err;
  const Result missing = Run({"submit", "-f", dir_.Path("missing.yaml")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("missing.yaml"), std::string::npos);
  EXPECT_TRUE(server_.jobs().submissions().empty());
}

TEST_F(CliTest, ListFollowsEveryPage) {
  for (int i = 0; i < 5; ++i) Submit();
  const Result result = Run({"-o", "json", "list"});
  ASSERT_EQ(result.code, 0) << result.err;
  const json list = json::parse(result.out);
  ASSERT_EQ(list["jobs"].size(), 5u);
  EXPECT_EQ(list["jobs"][0]["id"], "job-5");
  EXPECT_EQ(list["jobs"][4]["id"], "job-1");

  ASSERT_EQ(Run({"cancel", "job-2"}).code, 0);
  const Result cancelled = Run({"-o", "json", "list", "--state", "cancelled"});
  ASSERT_EQ(cancelled.code, 0) << cancelled.err;
  ASSERT_EQ(json::parse(cancelled.out)["jobs"].size(), 1u);

  const Result table = Run({"list", "--state", "PENDING", "--state", "cancelled"});
  ASSERT_EQ(table.code, 0);
  std::istringstream lines(table.out);
  std::string header;
  std::getline(lines, header);
  EXPECT_EQ(header.rfind("ID     NAME  STATE      PRIORITY  RANKS  PROGRESS  LOSS  AGE", 0), 0u)
      << header;
  int rows = 0;
  for (std::string line; std::getline(lines, line);) ++rows;
  EXPECT_EQ(rows, 5);
}

TEST_F(CliTest, ListRejectsUnknownState) {
  const Result result = Run({"list", "--state", "done"});
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("--state"), std::string::npos);
}

TEST_F(CliTest, GetShowsJobOrNotFound) {
  const std::string id = Submit("r");
  const Result json_result = Run({"get", id, "-o", "json"});
  ASSERT_EQ(json_result.code, 0) << json_result.err;
  EXPECT_EQ(json::parse(json_result.out)["id"], id);
  const Result table = Run({"get", id});
  ASSERT_EQ(table.code, 0);
  EXPECT_NE(table.out.find("state       PENDING"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("request id  r"), std::string::npos) << table.out;

  const Result missing = Run({"get", "nope"});
  EXPECT_EQ(missing.code, 3);
  EXPECT_NE(missing.err.find("job nope not found"), std::string::npos) << missing.err;
}

// `restarts` counts what used max_restarts; the attempts workers ended are apart.
TEST_F(CliTest, GetCountsOnlyTheRestartsTheJobUsed) {
  const std::string id = Submit();
  server_.jobs().SetRestarts(id, 4, 1, 2);
  const Result table = Run({"get", id});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("restarts    1 of 0; 3 more not counted (2 worker left or lost, 1 start "
                           "timed out)"),
            std::string::npos)
      << table.out;
}

TEST_F(CliTest, GetShowsAContextParallelJobsRendezvous) {
  const std::string id = Submit();
  server_.jobs().SetRendezvous(id, "10.0.0.7:29500");
  const Result table = Run({"get", id});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("rendezvous  10.0.0.7:29500"), std::string::npos) << table.out;
}

TEST_F(CliTest, CancelReportsStateAndConflicts) {
  const std::string id = Submit();
  const Result result = Run({"-o", "json", "cancel", id, "--reason", "not needed"});
  ASSERT_EQ(result.code, 0) << result.err;
  const json job = json::parse(result.out);
  EXPECT_EQ(job["state"], "JOB_STATE_CANCELLED");
  EXPECT_EQ(job["reason"], "not needed");

  const std::string done = Submit();
  server_.jobs().SetState(done, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Run({"cancel", done}).code, 6);
  EXPECT_EQ(Run({"cancel", "nope"}).code, 3);
}

TEST_F(CliTest, WatchExitsWithTheJobsOutcome) {
  const std::string ok = Submit();
  server_.jobs().SetEvents(
      ok, {StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_RUNNING), StepEvent(2, 10),
           StateEvent(3, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED)});
  const Result success = Run({"watch", ok});
  EXPECT_EQ(success.code, 0) << success.err;
  EXPECT_NE(success.out.find("state RUNNING\n"), std::string::npos) << success.out;
  EXPECT_NE(success.out.find("step 10/20"), std::string::npos);
  EXPECT_NE(success.out.find("job " + ok + " SUCCEEDED"), std::string::npos);

  const std::string failed = Submit();
  server_.jobs().SetEvents(
      failed, {StateEvent(1, v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED, "rank 0 exited 1")});
  const Result failure = Run({"watch", failed});
  EXPECT_EQ(failure.code, 1);
  EXPECT_NE(failure.out.find("FAILED: rank 0 exited 1"), std::string::npos) << failure.out;

  const std::string cancelled = Submit();
  server_.jobs().SetEvents(cancelled,
                           {StateEvent(1, v1::JOB_STATE_PENDING, v1::JOB_STATE_CANCELLED)});
  EXPECT_EQ(Run({"watch", cancelled}).code, 1);
  EXPECT_EQ(Run({"watch", "nope"}).code, 3);
}

TEST_F(CliTest, WatchJsonIsOneEventPerLine) {
  const std::string id = Submit();
  server_.jobs().SetEvents(id, {StepEvent(1, 5), StepEvent(2, 10),
                                StateEvent(3, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED)});
  const Result result = Run({"-o", "json", "watch", id});
  ASSERT_EQ(result.code, 0) << result.err;
  std::istringstream lines(result.out);
  std::vector<json> events;
  for (std::string line; std::getline(lines, line);) events.push_back(json::parse(line));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1]["trainer"]["event"]["step"]["step"], "10");  // int64: a string in JSON
  EXPECT_EQ(events[2]["state_change"]["to"], "JOB_STATE_SUCCEEDED");
}

TEST_F(CliTest, SubmitWatchFollowsTheJob) {
  // The fake numbers jobs in order, so the events can be staged before the submission.
  const std::string next = "job-1";
  const Result no_events_yet = Run({"get", next});
  EXPECT_EQ(no_events_yet.code, 3);
  const Result submitted = Run({"submit", "-f", spec_, "--request-id", "w"});
  ASSERT_EQ(submitted.code, 0);
  server_.jobs().SetEvents(next, {StateEvent(1, v1::JOB_STATE_PENDING, v1::JOB_STATE_SUCCEEDED)});
  const Result watched = Run({"submit", "-f", spec_, "--request-id", "w", "--watch"});
  EXPECT_EQ(watched.code, 0) << watched.err;
  EXPECT_NE(watched.out.find("job job-1 SUCCEEDED"), std::string::npos) << watched.out;
}

TEST_F(CliTest, LogsPrintsTheRanksLog) {
  const std::string id = Submit();
  const Result result = Run({"logs", id, "--rank", "3"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.out, "line one\nrank 3\n");
  EXPECT_EQ(Run({"logs", "nope"}).code, 3);
}

TEST_F(CliTest, WorkersTable) {
  const Result result = Run({"workers"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("ID        ADDRESS   STATE   DEVICES"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("worker-a  10.0.0.7  ONLINE  2x cpu (8.0 GiB)  job-1/0"),
            std::string::npos)
      << result.out;
  const Result as_json = Run({"workers", "-o", "json"});
  EXPECT_EQ(json::parse(as_json.out)["workers"][0]["id"], "worker-a");
}

TEST_F(CliTest, PlanPrintsThePlan) {
  const Result result = Run({"-o", "json", "plan", "-f", spec_, "--ranks", "2"});
  ASSERT_EQ(result.code, 0) << result.err;
  const json plan = json::parse(result.out);
  EXPECT_TRUE(plan["feasible"].get<bool>());
  EXPECT_EQ(plan["ranks"], 2);
  const Result table = Run({"plan", "-f", spec_});
  EXPECT_NE(table.out.find("memory per rank   3.0 GiB"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("note: fake planner"), std::string::npos);
}

// 128K tokens of sparse attention: CP up to 8 on 8 GPUs.
constexpr char kLongSpec[] = R"(name: long
model: {vocab_size: 256, d_model: 1024, layers: 4, heads: 16, head_dim_qk: 128, rope_dim: 64,
        head_dim_v: 128, d_ff: 4096, indexer: {heads: 16, dim: 64, rope_dim: 32, topk: 512}}
data: {seq_len: 131072, batch_size: 1, text_file: {path: /dev/null}}
stages: [{steps: 10, lr: 1.0e-4, attention: SPARSE}]
)";

TEST_F(CliTest, PlanOfflinePrintsTheCandidateTableAndWhy) {
  const std::string spec = Write("long.yaml", kLongSpec);
  const Result result = RunRaw({"plan", spec, "--gpus", "8", "--gpu", "h800", "--top", "3"});
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string& out = result.out;
  EXPECT_EQ(out.rfind("PLAN ", 0), 0u) << out;
  EXPECT_NE(out.find("  STEP  "), std::string::npos);
  EXPECT_NE(out.find("  EXPOSED COMM  MEMORY  "), std::string::npos);
  EXPECT_NE(out.find("  winner\n"), std::string::npos) << out;
  EXPECT_NE(out.find("more candidates not shown; --top 0 shows all"), std::string::npos);
  EXPECT_NE(out.find("why: winner cp 8 zigzag"), std::string::npos) << out;
  EXPECT_NE(out.find("why: layout: next best cp 8 contiguous"), std::string::npos);
  EXPECT_NE(out.find("(causal imbalance 1.8"), std::string::npos) << out;  // 2 - 1/P
  EXPECT_NE(out.find("note: profile h800, 8 devices, 131072 tokens"), std::string::npos);
  EXPECT_EQ(out.find("source: "), std::string::npos);

  const Result sources = RunRaw({"plan", spec, "--gpu", "h200", "--sources"});
  EXPECT_NE(sources.out.find("source: flash_topk_tflops: measured: "), std::string::npos);

  const Result as_json = RunRaw({"-o", "json", "plan", spec, "--gpus", "8", "--gpu", "h800"});
  ASSERT_EQ(as_json.code, 0) << as_json.err;
  const json plan = json::parse(as_json.out);
  // CP 1, 2, 4, 8 x layouts x indexer groups x 5 G x 3 recomputation policies.
  EXPECT_EQ(plan["candidates"].size(), (1u + 3 * 6) * 5 * 3);
  EXPECT_EQ(plan["winner"], 0);
  EXPECT_EQ(plan["candidates"][0]["context_parallel"], 8);
  EXPECT_GT(plan["candidates"][0]["step_seconds"].get<double>(), 0);
  EXPECT_EQ(plan["profile"], "h800");
  EXPECT_EQ(plan["candidates"][0]["stack"], "hyscale");
  const json& layer = plan["candidates"][0]["layer_seconds"];
  for (const char* term : {"selection", "score_gather", "attention_fwd", "attention_bwd",
                           "recompute", "gather_exposed", "reduce_scatter"}) {
    EXPECT_GE(layer[term].get<double>(), 0) << term;
  }
  EXPECT_GT(layer["attention_bwd"].get<double>(), layer["attention_fwd"].get<double>());

  const Result megatron =
      RunRaw({"-o", "json", "plan", spec, "--gpus", "8", "--gpu", "h200", "--stack", "megatron"});
  ASSERT_EQ(megatron.code, 0) << megatron.err;
  for (const auto& candidate : json::parse(megatron.out)["candidates"]) {
    EXPECT_EQ(candidate["stack"], "megatron");
    EXPECT_EQ(candidate["query_group"], 1);
    EXPECT_NE(candidate["recompute"], "replay");
  }
  const Result naive = RunRaw(
      {"-o", "json", "plan", spec, "--gpus", "8", "--gpu", "h200", "--stack", "megatron-naive"});
  ASSERT_EQ(naive.code, 0) << naive.err;
  EXPECT_EQ(json::parse(naive.out)["candidates"][0]["stack"], "megatron-naive");
  EXPECT_EQ(RunRaw({"plan", spec, "--gpus", "8", "--stack", "fast"}).code, 2);

  // A job's measured key sharing plans offline on its own, replacing dedup(G) for the G given.
  const Result shared = RunRaw(
      {"plan", spec, "--key-sharing", "2=1.05,4=1.1,8=1.3,16=1.7", "--sources", "--top", "1"});
  ASSERT_EQ(shared.code, 0) << shared.err;
  EXPECT_NE(shared.out.find("source: sparse_attention.dedup: measured key sharing: "
                            "2=1.05,4=1.1,8=1.3,16=1.7\n"),
            std::string::npos)
      << shared.out;
  const Result bad = RunRaw({"plan", spec, "--key-sharing", "3=1.5"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--key-sharing: key sharing: G 3 is not a query group above 1"),
            std::string::npos)
      << bad.err;
}

// A dense warm-up of the indexer, then the sparse stage: the table ranks on the job's time (its JOB
// column) and each stage's step and memory are in the notes and the JSON.
TEST_F(CliTest, PlanOfflineRanksAJobOfStagesOnItsTime) {
  std::string text = kLongSpec;
  text.replace(text.find("stages: ["), 9,
               "stages: [{name: warmup, steps: 1000, lr: 1.0e-3, attention: DENSE, trains: "
               "INDEXER_ONLY, indexer_loss_weight: 1.0}, ");
  const std::string spec = Write("warmup.yaml", text);
  const Result result = RunRaw({"plan", spec, "--gpus", "8", "--gpu", "h200", "--top", "3"});
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string& out = result.out;
  EXPECT_EQ(out.rfind("PLAN ", 0), 0u) << out;
  EXPECT_NE(out.find("  JOB  "), std::string::npos) << out;
  EXPECT_NE(out.find("% slower over the job ("), std::string::npos) << out;
  EXPECT_NE(out.find("note: stage 'warmup' (dense, the indexer alone, 131072 tokens x 1, 1000 "
                     "steps): "),
            std::string::npos)
      << out;

  const Result as_json = RunRaw({"-o", "json", "plan", spec, "--gpus", "8", "--gpu", "h200"});
  ASSERT_EQ(as_json.code, 0) << as_json.err;
  const json plan = json::parse(as_json.out);
  ASSERT_EQ(plan["stages"].size(), 2u);
  const double job = plan["job_seconds"].get<double>();
  EXPECT_DOUBLE_EQ(plan["candidates"][0]["job_seconds"].get<double>(), job);
  EXPECT_DOUBLE_EQ(job, 1000 * plan["stages"][0]["step_seconds"].get<double>() +
                            10 * plan["stages"][1]["step_seconds"].get<double>());
  for (const auto& candidate : plan["candidates"]) {
    if (!candidate.contains("rejected")) {
      EXPECT_LE(job, candidate["job_seconds"].get<double>());
    }
  }
}

TEST_F(CliTest, PlanOfflineRejectsWhatDoesNotFit) {
  std::string text = kLongSpec;
  text.replace(text.find("vocab_size: 256"), 15, "vocab_size: 16777216");  // 512 GiB of weights
  const std::string spec = Write("deep.yaml", text);
  const Result result = RunRaw({"plan", spec, "--gpus", "1", "--gpu", "h800", "--top", "0"});
  EXPECT_NE(result.code, 0);
  EXPECT_NE(result.out.find("rejected: memory "), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("GiB of h800"), std::string::npos);
  EXPECT_NE(result.err.find("no plan fits"), std::string::npos) << result.err;
  EXPECT_EQ(RunRaw({"plan", spec, "--gpu", "a100"}).code, 2);
  const std::string calibration = Write("bad.json", R"({"flash_topk": 1})");
  const Result bad = RunRaw({"plan", spec, "--gpu", "h200", "--calibration", calibration});
  EXPECT_NE(bad.err.find("calibration: flash_topk: Cannot find field"), std::string::npos)
      << bad.err;
}

TEST(CliAuthTest, TokenFromFlagFileOrEnvironment) {
  unsetenv("HYSCALE_TOKEN");
  FakeServer server("s3cret");
  const util::TempDir dir = util::TempDir::Create("hyscale-cli").value();
  const std::string spec = dir.Path("job.yaml");
  std::ofstream(spec) << kSpec;
  const std::string token_file = dir.Path("token");
  std::ofstream(token_file) << "s3cret\n";
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--server", server.address(), "submit", "-f", spec};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    return RunCli(args, out, err);
  };
  EXPECT_EQ(run({}), 4);
  EXPECT_EQ(run({"--token", "wrong"}), 4);
  EXPECT_EQ(run({"--token", "s3cret"}), 0);
  EXPECT_EQ(run({"--token-file", token_file}), 0);
  setenv("HYSCALE_TOKEN", "s3cret", 1);
  EXPECT_EQ(run({}), 0);
  unsetenv("HYSCALE_TOKEN");
}

TEST(CliErrorsTest, UnavailableServerTimesOut) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCli({"--server", "127.0.0.1:1", "--timeout", "1", "get", "x"}, out, err), 5);
  EXPECT_NE(err.str().find("UNAVAILABLE"), std::string::npos) << err.str();
}

TEST(CliErrorsTest, ServerFromEnvironment) {
  FakeServer server;
  setenv("HYSCALE_SERVER", server.address().c_str(), 1);
  std::ostringstream out, err;
  EXPECT_EQ(RunCli({"workers"}, out, err), 0) << err.str();
  unsetenv("HYSCALE_SERVER");
}

TEST(CliErrorsTest, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},
           {"frobnicate"},
           {"get"},
           {"--bogus", "list"},
           {"-o", "xml", "list"},
           {"submit"},
           {"submit", "-f", "x.yaml", "--ranks", "0"},
           {"submit", "-f", "x.yaml", "--device", "tpu"},
           {"logs", "j", "--rank", "x"},
       }) {
    std::ostringstream out, err;
    EXPECT_EQ(RunCli(args, out, err), 2) << ::testing::PrintToString(args);
  }
}

TEST(CliErrorsTest, HelpListsExitCodes) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCli({"--help"}, out, err), 0);
  const std::string help = out.str() + err.str();
  EXPECT_NE(help.find("Exit codes:"), std::string::npos);
  EXPECT_NE(help.find("5  coordinator unavailable"), std::string::npos);
  EXPECT_NE(help.find("up"), std::string::npos);
}

}  // namespace
}  // namespace hyscale::cli
