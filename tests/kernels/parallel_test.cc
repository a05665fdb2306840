// parallel_for chunking and error propagation; the key inversion the backward kernels share.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/index_inversion.h"
#include "kernels/cpu/parallel.h"

namespace hyscale::cpu {
namespace {

TEST(ParallelForTest, ChunksDoNotDependOnTheThreadCount) {
  for (const int threads : {0, 1, 2, 3, 8, 64}) {
    std::vector<std::atomic<int>> visits(103);
    std::vector<std::pair<int64_t, int64_t>> chunks(103, {-1, -1});
    parallel_for(5, 103, 7, CpuContext{threads}, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        ++visits[i];
        chunks[i] = {lo, hi};
      }
    });
    for (int64_t i = 0; i < 103; ++i) {
      ASSERT_EQ(visits[i], i >= 5 ? 1 : 0) << "threads " << threads << " index " << i;
      if (i < 5) continue;
      const int64_t lo = 5 + (i - 5) / 7 * 7;
      ASSERT_EQ(chunks[i], std::make_pair(lo, std::min<int64_t>(lo + 7, 103))) << "index " << i;
    }
  }
}

TEST(ParallelForTest, EmptyRangeCallsNothing) {
  int calls = 0;
  parallel_for(4, 4, 3, CpuContext{3}, [&](int64_t, int64_t) { ++calls; });
  parallel_for(4, 2, 3, CpuContext{3}, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelForTest, RethrowsAnExceptionAfterEveryThreadFinished) {
  std::atomic<int> chunks_run{0};
  EXPECT_THROW(parallel_for(0, 50, 1, CpuContext{4},
                            [&](int64_t lo, int64_t) {
                              ++chunks_run;
                              if (lo == 17) throw std::runtime_error("chunk 17");
                            }),
               std::runtime_error);
  EXPECT_EQ(chunks_run, 50);  // the other chunks still ran; nothing is left running
}

TEST(KeySelectionsTest, ListsEntriesPerKeyByRowThenSlot) {
  // rows x topk = 3 x 3
  const std::vector<int32_t> indices = {2,  0, -1,  //
                                        0,  2, 2,   //
                                        -1, 3, 0};
  const KeySelections selections(indices.data(), 3, 3, 5);
  const auto list = [&](int64_t s) {
    const auto entries = selections.of_key(s);
    return std::vector<int64_t>(entries.begin(), entries.end());
  };
  EXPECT_EQ(list(0), (std::vector<int64_t>{1, 3, 8}));
  EXPECT_EQ(list(1), (std::vector<int64_t>{}));
  EXPECT_EQ(list(2), (std::vector<int64_t>{0, 4, 5}));
  EXPECT_EQ(list(3), (std::vector<int64_t>{7}));
  EXPECT_EQ(list(4), (std::vector<int64_t>{}));
}

TEST(KeySelectionsTest, RejectsIndicesOutsideTheKeys) {
  for (const int32_t bad : {5, -2}) {
    const std::vector<int32_t> indices = {0, bad};
    EXPECT_THROW(KeySelections(indices.data(), 1, 2, 5), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace hyscale::cpu
