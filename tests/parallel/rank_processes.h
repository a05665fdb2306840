// Runs the ranks of a test group as real processes of cp_worker on this machine, against a
// store this process serves on a free loopback port; every wait has a deadline.
#pragma once

#include <string>
#include <vector>

namespace hyscale::parallel::testing {

struct RankResult {
  int exit_code = -1;  // -1: killed by a signal or by the deadline
  std::string log;     // its stderr
  double seconds = 0;  // from the start of the group until it exited
};

// Starts `world` processes `cp_worker <mode> <rank> <world> <port> <extra...>` and waits for
// all of them; a rank still running after deadline_s is killed (and reported as -1).
std::vector<RankResult> RunRanks(const std::string& mode, int world,
                                 const std::vector<std::string>& extra, double deadline_s);

}  // namespace hyscale::parallel::testing
