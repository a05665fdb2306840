#include "server/metrics.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace hyscale::server {

namespace {

// Prometheus' escapes: backslash and newline, and double quote where `quote` is set.
std::string Escape(const std::string& text, bool quote) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// The labels of every series of a family.
template <typename Series>
std::vector<LabelValues> LabelsOf(const std::map<LabelValues, Series>& series) {
  std::vector<LabelValues> out;
  for (const auto& entry : series) out.push_back(entry.first);
  return out;
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  return Escape(value, /*quote=*/true);
}

std::string EscapeHelp(const std::string& help) {
  return Escape(help, /*quote=*/false);
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<long long>(value));
  }
  // The shortest of %.15g / %.17g that reads back exactly, so bucket bounds print as written.
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.15g", value);
  if (std::strtod(buffer, nullptr) != value) std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

MetricFamily::MetricFamily(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}

void MetricFamily::RemoveWhere(const std::string& label_name, const std::string& value) {
  const auto it = std::find(label_names_.begin(), label_names_.end(), label_name);
  if (it == label_names_.end()) return;
  const size_t index = it - label_names_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& labels : SeriesLabels()) {
    if (labels[index] == value) EraseSeries(labels);
  }
}

void MetricFamily::RenderHeader(const char* type, std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n# TYPE ", name_, " ", type,
                  "\n");
}

std::string MetricFamily::LabelText(const LabelValues& values, const std::string& extra) const {
  if (label_names_.empty() && extra.empty()) return "";
  std::string text = "{";
  for (size_t i = 0; i < label_names_.size(); ++i) {
    if (i > 0) text += ",";
    absl::StrAppend(&text, label_names_[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&text, label_names_.empty() ? "" : ",", extra);
  return text + "}";
}

ValueFamily::ValueFamily(const char* type, std::string name, std::string help,
                         std::vector<std::string> label_names)
    : MetricFamily(std::move(name), std::move(help), std::move(label_names)), type_(type) {}

std::vector<LabelValues> ValueFamily::SeriesLabels() const {
  return LabelsOf(values_);
}

void ValueFamily::Render(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  RenderHeader(type_, out);
  for (const auto& [labels, value] : values_) {
    absl::StrAppend(out, name_, LabelText(labels), " ", FormatValue(value), "\n");
  }
}

Counter::Counter(std::string name, std::string help, std::vector<std::string> label_names)
    : ValueFamily("counter", std::move(name), std::move(help), std::move(label_names)) {}

void Counter::Inc(const LabelValues& labels, double amount) {
  std::lock_guard<std::mutex> lock(mu_);
  if (labels.size() == label_names_.size()) values_[labels] += amount;
}

Gauge::Gauge(std::string name, std::string help, std::vector<std::string> label_names)
    : ValueFamily("gauge", std::move(name), std::move(help), std::move(label_names)) {}

void Gauge::Set(const LabelValues& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (labels.size() == label_names_.size()) values_[labels] = value;
}

Histogram::Histogram(std::string name, std::string help, std::vector<std::string> label_names,
                     std::vector<double> bounds)
    : MetricFamily(std::move(name), std::move(help), std::move(label_names)),
      bounds_(std::move(bounds)) {}

void Histogram::Observe(const LabelValues& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (labels.size() != label_names_.size()) return;
  Series& series = series_[labels];
  if (series.counts.empty()) series.counts.assign(bounds_.size(), 0);
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  if (bucket < bounds_.size()) ++series.counts[bucket];
  ++series.count;
  series.sum += value;
}

std::vector<LabelValues> Histogram::SeriesLabels() const {
  return LabelsOf(series_);
}

void Histogram::Render(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  RenderHeader("histogram", out);
  for (const auto& [labels, series] : series_) {
    long long cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cumulative += series.counts[i];
      absl::StrAppend(out, name_, "_bucket",
                      LabelText(labels, absl::StrCat("le=\"", FormatValue(bounds_[i]), "\"")), " ",
                      cumulative, "\n");
    }
    absl::StrAppend(out, name_, "_bucket", LabelText(labels, "le=\"+Inf\""), " ", series.count,
                    "\n");
    absl::StrAppend(out, name_, "_sum", LabelText(labels), " ", FormatValue(series.sum), "\n");
    absl::StrAppend(out, name_, "_count", LabelText(labels), " ", series.count, "\n");
  }
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     std::vector<std::string> label_names) {
  return Add<Counter>(name, help, std::move(label_names));
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, std::move(label_names));
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<std::string> label_names,
                                         std::vector<double> bounds) {
  return Add<Histogram>(name, help, std::move(label_names), std::move(bounds));
}

void MetricsRegistry::RemoveWhere(const std::string& label_name, const std::string& value) {
  for (auto& family : families_) family->RemoveWhere(label_name, value);
}

std::string MetricsRegistry::Render() const {
  std::string out;
  for (const auto& family : families_) family->Render(&out);
  return out;
}

}  // namespace hyscale::server
