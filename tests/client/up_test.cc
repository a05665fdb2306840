// `hyscale up -f`: the real hyscale, hyscaled and hyscale-worker binaries as processes on
// loopback, with a fake trainer script, so the embedded default is tested end to end.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/client/tiny_spec.h"

namespace {

constexpr const char* kSpec = hyscale::cli::testing::kTinySpec;

// Prints the trainer's event lines; exits with $FAKE_EXIT (default 0).
constexpr char kTrainer[] = R"SH(#!/bin/sh
echo '{"time":1,"job_started":{"name":"tiny","total_steps":3}}'
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
  std::string output;
};

Outcome Shell(const std::string& command) {
  Outcome run{-1, ""};
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class UpTest : public ::testing::Test {
 protected:
  UpTest() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hyscale-up-XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
    // A worker run as root starts trainers as nobody: they must reach the script.
    chmod(dir_.c_str(), 0755);
    std::ofstream(dir_ + "/job.yaml") << kSpec;
    std::ofstream(dir_ + "/train.sh") << kTrainer;
    chmod((dir_ + "/train.sh").c_str(), 0755);
  }
  ~UpTest() override { std::filesystem::remove_all(dir_); }

  Outcome Up(const std::string& env = "") {
    return Shell(
        env + " timeout 120 " HYSCALE_BIN " --server 127.0.0.1:" + std::to_string(FreePort()) +
        " up --data-dir " + dir_ + "/data -f " + dir_ + "/job.yaml --devices cpu:1 --trainer " +
        dir_ + "/train.sh --metrics-listen 127.0.0.1:0");
  }

  std::string dir_;
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
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/data/hyscaled.log"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/data/hyscale-worker.log"));
  // Both children are gone: the worker log ends with its shutdown.
  std::ifstream log(dir_ + "/data/hyscale-worker.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("hyscale-worker: stopped"), std::string::npos) << text;
}

TEST_F(UpTest, FailedJobExitsOne) {
  const Outcome run = Up("FAKE_EXIT=1");
  EXPECT_EQ(run.code, 1) << run.output;
  EXPECT_NE(run.output.find("FAILED"), std::string::npos) << run.output;
}

TEST_F(UpTest, InvalidSpecExitsTwoBeforeStartingAnything) {
  std::ofstream(dir_ + "/job.yaml") << "name: broken\n";
  const Outcome run = Up();
  EXPECT_EQ(run.code, 2) << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/data/hyscaled.log"));
}

TEST_F(UpTest, ServesUntilInterruptedThenStopsBoth) {
  const std::string server = "127.0.0.1:" + std::to_string(FreePort());
  const std::string output = dir_ + "/up.out";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(output.c_str(), "w", stderr);
    execl(HYSCALE_BIN, HYSCALE_BIN, "--server", server.c_str(), "up", "--data-dir",
          (dir_ + "/data").c_str(), "--devices", "cpu:1", "--trainer", (dir_ + "/train.sh").c_str(),
          "--metrics-listen", "127.0.0.1:0", static_cast<char*>(nullptr));
    _exit(127);
  }
  bool serving = false;
  for (int i = 0; i < 600 && !serving; ++i) {
    serving = ReadAll(output).find("serving") != std::string::npos;
    if (!serving) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(serving) << ReadAll(output);
  const Outcome workers = Shell(HYSCALE_BIN " --server " + server + " workers");
  EXPECT_EQ(workers.code, 0) << workers.output;
  EXPECT_NE(workers.output.find("local"), std::string::npos) << workers.output;

  kill(pid, SIGINT);
  int status = -1;
  for (int i = 0; i < 600 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(WIFEXITED(status)) << ReadAll(output);
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadAll(output);
  // Both children shut down cleanly rather than being orphaned.
  EXPECT_NE(ReadAll(dir_ + "/data/hyscale-worker.log").find("hyscale-worker: stopped"),
            std::string::npos);
  EXPECT_NE(ReadAll(dir_ + "/data/hyscaled.log").find("shutting down"), std::string::npos)
      << ReadAll(dir_ + "/data/hyscaled.log");
  EXPECT_NE(Shell(HYSCALE_BIN " --timeout 1 --server " + server + " workers").code, 0);
}

}  // namespace
