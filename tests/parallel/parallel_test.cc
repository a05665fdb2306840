// Context parallelism on CPU with real processes on this machine (Gloo over loopback).
#include <gtest/gtest.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <tuple>

#include "tests/parallel/rank_processes.h"

namespace hyscale::parallel::testing {
namespace {

void ExpectAllPassed(const std::vector<RankResult>& ranks) {
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    EXPECT_EQ(ranks[rank].exit_code, 0) << "rank " << rank << " log:\n" << ranks[rank].log;
  }
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, GlooMatchesExpectedValues) {
  ExpectAllPassed(RunRanks("collectives", GetParam(), {}, 30));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives, ::testing::Values(2, 4));

// Every layout, sparse (with and without recomputation) and dense attention: the
// context-parallel DSA layer equals the single-process one (cp_worker.cc, run_layer).
class ContextParallelLayer : public ::testing::TestWithParam<int> {};

TEST_P(ContextParallelLayer, MatchesTheSingleProcessLayer) {
  const auto ranks = RunRanks("layer", GetParam(), {}, 50);
  ExpectAllPassed(ranks);
  std::cout << "rank 0: " << ranks[0].log;  // communication times per layout
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ContextParallelLayer, ::testing::Values(2, 4));

// A rank killed (dead_rank) or stuck outside the collective (stuck_rank) fails the others
// within the 3 s communication timeout.
class LostRank : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(LostRank, SurvivorsFailWithinTheTimeout) {
  const auto& [mode, world] = GetParam();
  const auto ranks = RunRanks(mode, world, {}, 20);
  for (int rank = 0; rank + 1 < world; ++rank) {
    const auto& r = ranks[rank];
    EXPECT_EQ(r.exit_code, 3) << "rank " << rank << " log:\n" << r.log;
    EXPECT_NE(r.log.find("all_reduce on rank " + std::to_string(rank)), std::string::npos) << r.log;
    // Measured by the rank from its first failing call: process start-up on a busy machine
    // does not count. The stuck rank sleeps 4 s past joining: the survivors must not wait.
    double seconds = -1;
    ASSERT_EQ(std::sscanf(r.log.c_str(), "failed after %lf s", &seconds), 1) << r.log;
    EXPECT_LT(seconds, 3.5) << r.log;
    // And it exits: a survivor hung in its teardown would run to the group's 20 s bound. The
    // margin allows a libtorch process's exit on a machine busy building (a margin of 1 s is
    // suspected in one failure under ctest -j2 beside a build, whose log was not kept).
    EXPECT_LT(r.seconds, ranks[world - 1].seconds + 3.0) << "a survivor outlived the lost rank";
  }
  std::cout << "rank 0: " << ranks[0].log;  // the error a user would see
}

// Stuck ranks cost the full timeout: one world size is enough there.
INSTANTIATE_TEST_SUITE_P(ModesAndWorldSizes, LostRank,
                         ::testing::Values(std::make_tuple(std::string("dead_rank"), 2),
                                           std::make_tuple(std::string("dead_rank"), 4),
                                           std::make_tuple(std::string("stuck_rank"), 2)));

}  // namespace
}  // namespace hyscale::parallel::testing
