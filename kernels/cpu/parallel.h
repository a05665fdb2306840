// parallel_for over fixed-size chunks. The chunking never depends on the thread count, so a
// kernel whose chunks write disjoint results is bit-identical for any ctx.threads.
// Threads are started per call (no global pool, no global state): the kernels here run for
// milliseconds or more, so the start-up cost does not matter and callers stay independent.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/shapes.h"

namespace hyscale::cpu {

// Calls fn(chunk_begin, chunk_end) once for each consecutive chunk of [begin, end) of `chunk`
// elements (the last may be shorter). Chunks go to ctx.threads threads first come first served
// (causal rows differ in cost); the first exception thrown by fn is rethrown here.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t chunk, const CpuContext& ctx, Fn&& fn) {
  if (end <= begin) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t chunks = (end - begin + chunk - 1) / chunk;
  const auto run_chunk = [&](int64_t c) {
    const int64_t lo = begin + c * chunk;
    fn(lo, std::min(end, lo + chunk));
  };
  const int64_t workers = std::min<int64_t>(ctx.threads, chunks);
  if (workers <= 1) {
    for (int64_t c = 0; c < chunks; ++c) run_chunk(c);
    return;
  }
  std::atomic<int64_t> next_chunk{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (int64_t c = next_chunk++; c < chunks; c = next_chunk++) {
      try {
        run_chunk(c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < workers; ++i) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads still run every chunk
    }
  }
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace hyscale::cpu
