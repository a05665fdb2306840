#include "tests/parallel/rank_processes.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "util/subprocess.h"
#include "util/temp_dir.h"
#include "worker/parallel/rendezvous.h"

namespace hyscale::parallel::testing {

std::vector<RankResult> RunRanks(const std::string& mode, int world,
                                 const std::vector<std::string>& extra, double deadline_s) {
  int port = 0;
  auto store = ServeStore("127.0.0.1", std::chrono::seconds(30), &port);
  EXPECT_TRUE(store.ok()) << store.status();
  const auto dir = util::TempDir::Create("hyscale-cp-" + mode);
  EXPECT_TRUE(dir.ok()) << dir.status();
  if (!dir.ok()) return {};
  const auto log_of = [&dir](int rank) {
    return dir->Path("rank" + std::to_string(rank) + ".log");
  };

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::optional<util::Subprocess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    util::Command command({HYSCALE_CP_WORKER, mode, std::to_string(rank), std::to_string(world),
                           std::to_string(port)});
    command.argv.insert(command.argv.end(), extra.begin(), extra.end());
    command.stderr_to = util::Redirect::WriteTo(log_of(rank));
    auto process = util::Subprocess::Start(command);
    EXPECT_TRUE(process.ok()) << process.status();
    ranks.push_back(process.ok() ? std::optional<util::Subprocess>(*std::move(process))
                                 : std::nullopt);
  }

  std::vector<RankResult> result(world);
  const auto since_start = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto deadline = start + std::chrono::duration<double>(deadline_s);
  for (int running = world; running > 0;) {
    running = 0;
    for (int rank = 0; rank < world; ++rank) {
      if (!ranks[rank]) continue;
      if (const auto exit = ranks[rank]->TryWait()) {
        result[rank].exit_code = exit->signal == 0 ? exit->exit_code : -1;
        result[rank].seconds = since_start();
        ranks[rank].reset();
      } else {
        ++running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      for (auto& rank : ranks) {
        if (rank) rank->Signal(SIGKILL);
      }
      for (int rank = 0; rank < world; ++rank) {
        if (!ranks[rank]) continue;
        ranks[rank]->Wait();
        result[rank].seconds = since_start();
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(log_of(rank));
    std::ostringstream text;
    text << in.rdbuf();
    result[rank].log = text.str();
  }
  return result;
}

}  // namespace hyscale::parallel::testing
