// `hyscale up -f`: the real hyscale, hyscaled and hyscale-worker binaries as processes on
// loopback, with a fake trainer script, so the embedded default is tested end to end.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/client/tiny_spec.h"
#include "util/subprocess.h"
#include "util/temp_dir.h"

namespace {

constexpr const char* kSpec = hyscale::cli::testing::kTinySpec;

// Prints the trainer's event lines (after $FAKE_SLEEP seconds, if set); exits with $FAKE_EXIT
// (default 0).
constexpr char kTrainer[] = R"SH(#!/bin/sh
echo '{"time":1,"job_started":{"name":"tiny","total_steps":3}}'
if [ -n "${FAKE_SLEEP:-}" ]; then sleep "$FAKE_SLEEP"; fi
for i in 1 2 3; do
  echo "{\"time\":1,\"step\":{\"step\":$i,\"total_steps\":3,\"loss\":1.5}}"
done
if [ "${FAKE_EXIT:-0}" != 0 ]; then
  echo '{"time":2,"job_finished":{"ok":false,"reason":"fake failure"}}'
  exit "$FAKE_EXIT"
fi
echo '{"time":2,"job_finished":{"ok":true,"elapsed_seconds":1}}'
)SH";

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

struct Outcome {
  int code;
  std::string output;  // stdout and stderr
};

// hyscale with `args`, killed if it runs for more than two minutes.
Outcome Hyscale(const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env = {}) {
  hyscale::util::Command command({HYSCALE_BIN});
  command.argv.insert(command.argv.end(), args.begin(), args.end());
  command.env = env;
  command.stderr_to = hyscale::util::Redirect::ToStdout();
  const auto run = hyscale::util::RunAndCapture(std::move(command), std::chrono::minutes(2));
  if (!run.ok()) return {-1, run.status().ToString()};
  return {run->exit.ShellCode(), run->output};
}

class UpTest : public ::testing::Test {
 protected:
  UpTest() {
    // A worker run as root starts trainers as nobody: they must reach the script.
    chmod(dir_.path().c_str(), 0755);
    std::ofstream(dir_.Path("job.yaml")) << kSpec;
    std::ofstream(dir_.Path("train.sh")) << kTrainer;
    chmod(dir_.Path("train.sh").c_str(), 0755);
  }

  Outcome Up(const std::vector<std::pair<std::string, std::string>>& env = {}) {
    return Hyscale({"--server", "127.0.0.1:" + std::to_string(FreePort()), "up", "--data-dir",
                    dir_.Path("data"), "-f", dir_.Path("job.yaml"), "--devices", "cpu:1",
                    "--trainer", dir_.Path("train.sh"), "--metrics-listen", "127.0.0.1:0"},
                   env);
  }

  const hyscale::util::TempDir dir_ = hyscale::util::TempDir::Create("hyscale-up").value();
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(UpTest, RunsJobToTheEndAndStops) {
  const Outcome run = Up();
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("step 3/3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("SUCCEEDED"), std::string::npos) << run.output;
  EXPECT_TRUE(std::filesystem::exists(dir_.Path("data/hyscaled.log")));
  EXPECT_TRUE(std::filesystem::exists(dir_.Path("data/hyscale-worker.log")));
  // Both children are gone: the worker log ends with its shutdown.
  std::ifstream log(dir_.Path("data/hyscale-worker.log"));
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("hyscale-worker: stopped"), std::string::npos) << text;
}

// The README's first command run twice on one data folder: the first run's agent left when it
// stopped, so the second run's agent takes the worker's name at once, and its job runs there
// rather than wait on the stored worker the first run left behind.
TEST_F(UpTest, RunsAgainOnTheSameDataFolder) {
  const Outcome first = Up();
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(ReadAll(dir_.Path("data/hyscaled.log")).find("left: its agent stopped"),
            std::string::npos)
      << ReadAll(dir_.Path("data/hyscaled.log"));
  const auto start = std::chrono::steady_clock::now();
  const Outcome second = Up();
  EXPECT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("SUCCEEDED"), std::string::npos) << second.output;
  // Far inside the lease a lost agent holds its name for (hyscaled's recovery grace and
  // heartbeat timeout, 25 s).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(ReadAll(dir_.Path("data/hyscale-worker.log")).find("held by another live agent"),
            std::string::npos);
}

// Ctrl-C during `up -f` cancels the job it runs: the data folder keeps no interrupted job that a
// later `up` would run again (its worker's stop alone would only end the attempt, uncounted).
TEST_F(UpTest, InterruptedRunCancelsItsJob) {
  const std::string server = "127.0.0.1:" + std::to_string(FreePort());
  const std::string output = dir_.Path("up.out");
  hyscale::util::Command command({HYSCALE_BIN, "--server", server, "up", "--data-dir",
                                  dir_.Path("data"), "-f", dir_.Path("job.yaml"), "--devices",
                                  "cpu:1", "--trainer", dir_.Path("train.sh"), "--metrics-listen",
                                  "127.0.0.1:0"});
  command.env = {{"FAKE_SLEEP", "600"}};
  command.stdout_to = hyscale::util::Redirect::WriteTo(output);
  command.stderr_to = hyscale::util::Redirect::ToStdout();
  auto up = hyscale::util::Subprocess::Start(command);
  ASSERT_TRUE(up.ok()) << up.status();
  // The job's id from "job ID submitted", then until it runs.
  std::string job_id;
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    const std::string text = ReadAll(output);
    if (const size_t at = text.find(" submitted ("); job_id.empty() && at != std::string::npos) {
      const size_t start = text.rfind("job ", at);
      job_id = text.substr(start + 4, at - start - 4);
    }
    running =
        !job_id.empty() &&
        Hyscale({"--server", server, "get", job_id}).output.find("RUNNING") != std::string::npos;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(running) << ReadAll(output);

  up->Signal(SIGINT);
  const auto exit = up->WaitFor(std::chrono::seconds(40));
  ASSERT_TRUE(exit.has_value()) << ReadAll(output);
  EXPECT_NE(exit->ShellCode(), 0);
  EXPECT_NE(ReadAll(output).find("job " + job_id + " cancelled"), std::string::npos)
      << ReadAll(output);

  // Served again from the same data folder, the job is CANCELLED and nothing runs it.
  hyscale::util::Command serve({HYSCALE_BIN, "--server", server, "up", "--data-dir",
                                dir_.Path("data"), "--devices", "cpu:1", "--trainer",
                                dir_.Path("train.sh"), "--metrics-listen", "127.0.0.1:0"});
  serve.stderr_to = hyscale::util::Redirect::WriteTo(dir_.Path("serve.out"));
  auto served = hyscale::util::Subprocess::Start(serve);
  ASSERT_TRUE(served.ok()) << served.status();
  bool serving = false;
  for (int i = 0; i < 600 && !serving; ++i) {
    serving = ReadAll(dir_.Path("serve.out")).find("serving") != std::string::npos;
    if (!serving) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(serving) << ReadAll(dir_.Path("serve.out"));
  const Outcome job = Hyscale({"--server", server, "get", job_id});
  EXPECT_NE(job.output.find("CANCELLED"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("hyscale up was interrupted"), std::string::npos) << job.output;
  served->Signal(SIGINT);
  EXPECT_TRUE(served->WaitFor(std::chrono::seconds(30)).has_value());
}

TEST_F(UpTest, FailedJobExitsOne) {
  const Outcome run = Up({{"FAKE_EXIT", "1"}});
  EXPECT_EQ(run.code, 1) << run.output;
  EXPECT_NE(run.output.find("FAILED"), std::string::npos) << run.output;
}

TEST_F(UpTest, InvalidSpecExitsTwoBeforeStartingAnything) {
  std::ofstream(dir_.Path("job.yaml")) << "name: broken\n";
  const Outcome run = Up();
  EXPECT_EQ(run.code, 2) << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("data/hyscaled.log")));
}

TEST_F(UpTest, ServesUntilInterruptedThenStopsBoth) {
  const std::string server = "127.0.0.1:" + std::to_string(FreePort());
  const std::string output = dir_.Path("up.out");
  hyscale::util::Command command({HYSCALE_BIN, "--server", server, "up", "--data-dir",
                                  dir_.Path("data"), "--devices", "cpu:1", "--trainer",
                                  dir_.Path("train.sh"), "--metrics-listen", "127.0.0.1:0"});
  command.stderr_to = hyscale::util::Redirect::WriteTo(output);
  auto up = hyscale::util::Subprocess::Start(command);
  ASSERT_TRUE(up.ok()) << up.status();
  bool serving = false;
  for (int i = 0; i < 600 && !serving; ++i) {
    serving = ReadAll(output).find("serving") != std::string::npos;
    if (!serving) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(serving) << ReadAll(output);
  const Outcome workers = Hyscale({"--server", server, "workers"});
  EXPECT_EQ(workers.code, 0) << workers.output;
  EXPECT_NE(workers.output.find("local"), std::string::npos) << workers.output;

  up->Signal(SIGINT);
  const auto exit = up->WaitFor(std::chrono::seconds(30));
  ASSERT_TRUE(exit.has_value()) << ReadAll(output);
  EXPECT_EQ(exit->ShellCode(), 0) << ReadAll(output);
  // Both children shut down cleanly rather than being orphaned.
  EXPECT_NE(ReadAll(dir_.Path("data/hyscale-worker.log")).find("hyscale-worker: stopped"),
            std::string::npos);
  EXPECT_NE(ReadAll(dir_.Path("data/hyscaled.log")).find("shutting down"), std::string::npos)
      << ReadAll(dir_.Path("data/hyscaled.log"));
  EXPECT_NE(Hyscale({"--timeout", "1", "--server", server, "workers"}).code, 0);
}

}  // namespace
