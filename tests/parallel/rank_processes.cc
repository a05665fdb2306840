#include "tests/parallel/rank_processes.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "worker/parallel/rendezvous.h"

extern char** environ;

namespace hyscale::parallel::testing {

std::vector<RankResult> RunRanks(const std::string& mode, int world,
                                 const std::vector<std::string>& extra, double deadline_s) {
  int port = 0;
  auto store = ServeStore("127.0.0.1", std::chrono::seconds(30), &port);
  EXPECT_TRUE(store.ok()) << store.status();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("hyscale-cp-" + std::to_string(::getpid()) + "-" + mode);
  std::filesystem::create_directories(dir);

  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> args{HYSCALE_CP_WORKER, mode, std::to_string(rank),
                                  std::to_string(world), std::to_string(port)};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const auto log = (dir / ("rank" + std::to_string(rank) + ".log")).string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }

  std::vector<RankResult> result(world);
  const auto since_start = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int running = world;
  const auto deadline = start + std::chrono::duration<double>(deadline_s);
  while (running > 0) {
    for (int rank = 0; rank < world; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[rank], &status, WNOHANG);
      if (done == pids[rank]) {
        result[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        result[rank].seconds = since_start();
        pids[rank] = 0;
        --running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      for (pid_t pid : pids) {
        if (pid > 0) ::kill(pid, SIGKILL);
      }
      for (int rank = 0; rank < world; ++rank) {
        if (pids[rank] <= 0) continue;
        ::waitpid(pids[rank], nullptr, 0);
        result[rank].seconds = since_start();
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(dir / ("rank" + std::to_string(rank) + ".log"));
    std::ostringstream text;
    text << in.rdbuf();
    result[rank].log = text.str();
  }
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace hyscale::parallel::testing
