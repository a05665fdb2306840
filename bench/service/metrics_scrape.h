// Reads hyscaled's /metrics (Prometheus text format) for the server's side of a benchmark.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <utility>
#include <vector>

namespace hyscale::bench {

// One histogram series, or several summed (same buckets).
struct HistogramSample {
  double count = 0;
  double sum = 0;
  std::vector<std::pair<double, double>> buckets;  // (upper bound "le", cumulative count)

  double MeanSeconds() const { return count > 0 ? sum / count : 0; }
  // The upper bound of the bucket holding the q-quantile: an upper estimate, as coarse as the
  // buckets (+inf when it falls in the last one, 0 when empty).
  double QuantileUpperBound(double q) const;
  // What was added between an `earlier` scrape and this one.
  HistogramSample Since(const HistogramSample& earlier) const;
};

absl::StatusOr<std::string> ScrapeMetrics(const std::string& host, int port);

// Sums the series of histogram `name` whose label text contains `label_filter` ("" for all),
// e.g. label_filter = "method=\"hyscale.v1.WorkerService/Heartbeat\"".
HistogramSample FindHistogram(const std::string& text, const std::string& name,
                              const std::string& label_filter);

}  // namespace hyscale::bench
