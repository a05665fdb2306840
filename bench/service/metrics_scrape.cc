#include "bench/service/metrics_scrape.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <absl/strings/string_view.h>
#include <httplib.h>

#include <cmath>
#include <limits>
#include <map>

namespace hyscale::bench {
namespace {

struct Line {
  std::string name;
  std::string labels;  // between the braces
  double value = 0;
};

bool ParseLine(absl::string_view text, Line* line) {
  if (text.empty() || text.front() == '#') return false;
  const auto space = text.rfind(' ');
  if (space == absl::string_view::npos) return false;
  const absl::string_view value = text.substr(space + 1);
  if (value == "+Inf") {
    line->value = std::numeric_limits<double>::infinity();
  } else if (!absl::SimpleAtod(value, &line->value)) {
    return false;
  }
  const absl::string_view series = text.substr(0, space);
  const auto brace = series.find('{');
  if (brace == absl::string_view::npos) {
    line->name = std::string(series);
    line->labels.clear();
  } else {
    line->name = std::string(series.substr(0, brace));
    const auto close = series.rfind('}');
    if (close == absl::string_view::npos || close < brace) return false;
    line->labels = std::string(series.substr(brace + 1, close - brace - 1));
  }
  return true;
}

// The "le" label's bound.
bool BucketBound(const std::string& labels, double* bound) {
  const auto at = labels.find("le=\"");
  if (at == std::string::npos) return false;
  const auto start = at + 4;
  const auto end = labels.find('"', start);
  if (end == std::string::npos) return false;
  const std::string text = labels.substr(start, end - start);
  if (text == "+Inf") {
    *bound = std::numeric_limits<double>::infinity();
    return true;
  }
  return absl::SimpleAtod(text, bound);
}

}  // namespace

double HistogramSample::QuantileUpperBound(double q) const {
  if (count <= 0) return 0;
  const double rank = q * count;
  for (const auto& [bound, cumulative] : buckets) {
    if (cumulative >= rank) return bound;
  }
  return std::numeric_limits<double>::infinity();
}

HistogramSample HistogramSample::Since(const HistogramSample& earlier) const {
  HistogramSample delta = *this;
  delta.count -= earlier.count;
  delta.sum -= earlier.sum;
  for (auto& [bound, cumulative] : delta.buckets) {
    for (const auto& [earlier_bound, earlier_cumulative] : earlier.buckets) {
      if (earlier_bound == bound) cumulative -= earlier_cumulative;
    }
  }
  return delta;
}

absl::StatusOr<std::string> ScrapeMetrics(const std::string& host, int port) {
  httplib::Client client(host, port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(10, 0);
  const auto response = client.Get("/metrics");
  if (!response) {
    return absl::UnavailableError(absl::StrCat("GET http://", host, ":", port,
                                               "/metrics: ", httplib::to_string(response.error())));
  }
  if (response->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET http://", host, ":", port, "/metrics: HTTP ", response->status));
  }
  return response->body;
}

HistogramSample FindHistogram(const std::string& text, const std::string& name,
                              const std::string& label_filter) {
  HistogramSample sample;
  std::map<double, double> buckets;
  Line line;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    if (!ParseLine(raw, &line)) continue;
    if (!label_filter.empty() && line.labels.find(label_filter) == std::string::npos) continue;
    if (line.name == name + "_count") {
      sample.count += line.value;
    } else if (line.name == name + "_sum") {
      sample.sum += line.value;
    } else if (line.name == name + "_bucket") {
      double bound = 0;
      if (BucketBound(line.labels, &bound)) buckets[bound] += line.value;
    }
  }
  sample.buckets.assign(buckets.begin(), buckets.end());
  return sample;
}

}  // namespace hyscale::bench
