#include "bench/service/latency.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hyscale::bench {

void LatencyRecorder::Add(Clock::duration latency) {
  const double ms = std::chrono::duration<double, std::milli>(latency).count();
  std::lock_guard<std::mutex> lock(mu_);
  millis_.push_back(ms);
}

LatencySummary LatencyRecorder::Summarize() const {
  std::vector<double> sorted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sorted = millis_;
  }
  LatencySummary summary;
  if (sorted.empty()) return summary;
  std::sort(sorted.begin(), sorted.end());
  const auto rank = [&](double q) {
    const auto index = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
    return sorted[std::min(sorted.size(), std::max<size_t>(index, 1)) - 1];
  };
  summary.count = static_cast<int64_t>(sorted.size());
  summary.p50_ms = rank(0.50);
  summary.p99_ms = rank(0.99);
  summary.max_ms = sorted.back();
  summary.mean_ms = std::accumulate(sorted.begin(), sorted.end(), 0.0) / summary.count;
  return summary;
}

}  // namespace hyscale::bench
