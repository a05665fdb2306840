// A small Prometheus registry: counters, gauges and histograms with labels, rendered in the text
// exposition format 0.0.4 (HELP/TYPE lines, escaped label values and help text). Debian ships no
// Prometheus client library for C++, and this is all hyscaled needs. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace hyscale::server {

using LabelValues = std::vector<std::string>;  // in the family's label-name order

class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names);
  virtual ~MetricFamily() = default;
  // Appends this family's HELP, TYPE and sample lines.
  virtual void Render(std::string* out) const = 0;
  // Drops every series whose label `label_name` equals `value` (bounded label sets).
  void RemoveWhere(const std::string& label_name, const std::string& value);

 protected:
  virtual void EraseSeries(const LabelValues& labels) = 0;
  virtual std::vector<LabelValues> SeriesLabels() const = 0;
  void RenderHeader(const char* type, std::string* out) const;
  // `{a="x",b="y"}` with `extra` (e.g. le="0.5") appended; "" when there are no labels.
  std::string LabelText(const LabelValues& values, const std::string& extra = "") const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;
};

// Counters and gauges: one value a series, rendered under `type`.
class ValueFamily : public MetricFamily {
 public:
  ValueFamily(const char* type, std::string name, std::string help,
              std::vector<std::string> label_names);
  void Render(std::string* out) const override;

 protected:
  std::map<LabelValues, double> values_;

 private:
  void EraseSeries(const LabelValues& labels) override { values_.erase(labels); }
  std::vector<LabelValues> SeriesLabels() const override;
  const char* const type_;
};

class Counter : public ValueFamily {
 public:
  Counter(std::string name, std::string help, std::vector<std::string> label_names);
  void Inc(const LabelValues& labels, double amount = 1);
};

class Gauge : public ValueFamily {
 public:
  Gauge(std::string name, std::string help, std::vector<std::string> label_names);
  void Set(const LabelValues& labels, double value);
};

class Histogram : public MetricFamily {
 public:
  // `bounds`: upper bounds of the buckets, increasing; +Inf is implied.
  Histogram(std::string name, std::string help, std::vector<std::string> label_names,
            std::vector<double> bounds);
  void Observe(const LabelValues& labels, double value);
  void Render(std::string* out) const override;

 private:
  struct Series {
    std::vector<long long> counts;  // per bucket, not cumulative
    long long count = 0;
    double sum = 0;
  };
  void EraseSeries(const LabelValues& labels) override { series_.erase(labels); }
  std::vector<LabelValues> SeriesLabels() const override;
  const std::vector<double> bounds_;
  std::map<LabelValues, Series> series_;
};

// Owns the families; renders them in registration order.
class MetricsRegistry {
 public:
  Counter* AddCounter(const std::string& name, const std::string& help,
                      std::vector<std::string> label_names = {});
  Gauge* AddGauge(const std::string& name, const std::string& help,
                  std::vector<std::string> label_names = {});
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names, std::vector<double> bounds);
  // Drops every series labelled `label_name`=`value` in every family.
  void RemoveWhere(const std::string& label_name, const std::string& value);
  std::string Render() const;

 private:
  template <typename Family, typename... Args>
  Family* Add(Args&&... args) {
    families_.push_back(std::make_unique<Family>(std::forward<Args>(args)...));
    return static_cast<Family*>(families_.back().get());
  }

  std::vector<std::unique_ptr<MetricFamily>> families_;
};

// Prometheus escaping: label values escape backslash, double quote and newline; HELP text escapes
// backslash and newline.
std::string EscapeLabelValue(const std::string& value);
std::string EscapeHelp(const std::string& help);
// A sample value: integers without exponent, +Inf/-Inf/NaN spelled as Prometheus expects.
std::string FormatValue(double value);

}  // namespace hyscale::server
