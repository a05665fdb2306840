// Latency samples and their summary (count, p50, p99, max, mean), safe to add from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace hyscale::bench {

using Clock = std::chrono::steady_clock;

struct LatencySummary {
  int64_t count = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
  double mean_ms = 0;
};

class LatencyRecorder {
 public:
  void Add(Clock::duration latency);
  void AddSince(Clock::time_point start) { Add(Clock::now() - start); }
  // Exact percentiles (nearest rank) over every sample so far.
  LatencySummary Summarize() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> millis_;
};

}  // namespace hyscale::bench
