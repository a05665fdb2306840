#include "server/metrics.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace hyscale::server {

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
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

void Counter::Inc(const LabelValues& labels, double amount) {
  std::lock_guard<std::mutex> lock(mu_);
  if (labels.size() == label_names_.size()) values_[labels] += amount;
}

std::vector<LabelValues> Counter::SeriesLabels() const {
  std::vector<LabelValues> out;
  for (const auto& entry : values_) out.push_back(entry.first);
  return out;
}

void Counter::Render(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  RenderHeader("counter", out);
  for (const auto& [labels, value] : values_) {
    absl::StrAppend(out, name_, LabelText(labels), " ", FormatValue(value), "\n");
  }
}

void Gauge::Set(const LabelValues& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (labels.size() == label_names_.size()) values_[labels] = value;
}

std::vector<LabelValues> Gauge::SeriesLabels() const {
  std::vector<LabelValues> out;
  for (const auto& entry : values_) out.push_back(entry.first);
  return out;
}

void Gauge::Render(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  RenderHeader("gauge", out);
  for (const auto& [labels, value] : values_) {
    absl::StrAppend(out, name_, LabelText(labels), " ", FormatValue(value), "\n");
  }
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
  std::vector<LabelValues> out;
  for (const auto& entry : series_) out.push_back(entry.first);
  return out;
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
  auto family = std::make_unique<Counter>(name, help, std::move(label_names));
  Counter* raw = family.get();
  families_.push_back(std::move(family));
  return raw;
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 std::vector<std::string> label_names) {
  auto family = std::make_unique<Gauge>(name, help, std::move(label_names));
  Gauge* raw = family.get();
  families_.push_back(std::move(family));
  return raw;
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<std::string> label_names,
                                         std::vector<double> bounds) {
  auto family = std::make_unique<Histogram>(name, help, std::move(label_names), std::move(bounds));
  Histogram* raw = family.get();
  families_.push_back(std::move(family));
  return raw;
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
