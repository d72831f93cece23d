// A small thread-safe metric registry: counters, gauges and histograms with
// fixed buckets, each a family of series told apart by label values, rendered
// in the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Usage:
//   MetricRegistry registry;
//   HW_ASSIGN_OR_RETURN(CounterFamily* tokens,
//       registry.AddCounter("headway:prompt_tokens_total", "Prompt tokens.", {"model_name"}));
//   HW_ASSIGN_OR_RETURN(Counter* c, tokens->WithLabels({"smollm2"}));
//   HW_RETURN_IF_ERROR(c->Increment(12));
//   std::string body = registry.RenderPrometheus();
//
// Names are rendered exactly as registered: a counter's name should end in
// `_total` (the convention of prometheus_client, which appends it). A
// histogram `x` renders `x_bucket{le=...}` (cumulative, ending with
// le="+Inf"), `x_sum` and `x_count`.
//
// Ownership and lifetime: the registry owns every family and series; the
// pointers it hands out stay valid until the registry is destroyed. Series
// are never removed, so counters never go down.
//
// Thread-safety: every method of every class here may be called from any
// thread. A rendered histogram is a consistent snapshot (its +Inf bucket
// equals its _count); different series are rendered one after another, not
// as one atomic snapshot.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace headway {

// The Content-Type a /metrics response must carry for this format.
inline constexpr const char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// True if `name` is a valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool IsValidMetricName(std::string_view name);

// True if `name` is a valid label name: [a-zA-Z_][a-zA-Z0-9_]*, not starting
// with "__" (reserved by Prometheus).
bool IsValidLabelName(std::string_view name);

// A label value as it appears between the quotes: \ -> \\, " -> \", newline -> \n.
std::string EscapeLabelValue(std::string_view value);

// A number as the format writes it: "+Inf", "-Inf", "NaN", otherwise the
// shortest decimal that reads back as the same double (e.g. "0.1", "2560").
std::string FormatMetricValue(double value);

// A monotonically increasing value (events, tokens).
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `amount`. Errors: InvalidArgument if amount is negative, NaN or
  // infinite (the counter is left unchanged, so it never goes down).
  Status Increment(double amount = 1.0);

  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue lengths, usage ratios).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets with upper bounds `le`.
class Histogram {
 public:
  // A consistent copy of the histogram's state.
  struct Snapshot {
    std::vector<double> upper_bounds;        // [num_buckets] ascending, finite; +Inf implied
    std::vector<uint64_t> cumulative_counts;  // [num_buckets + 1]; last = count (le="+Inf")
    double sum = 0.0;
    uint64_t count = 0;
  };

  // REQUIRES: upper_bounds strictly ascending and finite (the family checks).
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` in the first bucket whose bound is >= value (bounds are
  // inclusive, as in Prometheus) and adds it to the sum.
  // Errors: InvalidArgument if value is NaN (the histogram is left unchanged).
  Status Observe(double value);

  Snapshot Read() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> bucket_counts_;  // guarded by mu_; [num_buckets + 1], not cumulative
  double sum_ = 0.0;                     // guarded by mu_
};

enum class MetricType { kCounter, kGauge, kHistogram };
const char* MetricTypeName(MetricType type);  // "counter", "gauge", "histogram"

// One metric name with its help text and label names; owns its series.
template <typename Series>
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names,
               std::vector<double> upper_bounds);
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  // Returns the series for `label_values` (one per label name, in the order
  // the names were registered), creating it at zero the first time.
  // Errors: InvalidArgument if the number of values differs from the number
  // of label names. Any string is a valid value (it is escaped on render).
  Result<Series*> WithLabels(const std::vector<std::string>& label_values);

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends this family's # HELP, # TYPE and sample lines to `out`; series
  // are ordered by their label values.
  void Render(std::string& out) const;

 private:
  // Constant after construction.
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> upper_bounds_;  // histograms only

  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series_;  // guarded by mu_
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

class MetricRegistry {
 public:
  MetricRegistry() = default;
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // Registers a family. Errors (InvalidArgument, nothing registered):
  // invalid metric or label name, empty help, a label name repeated, a name already
  // registered or colliding with the _bucket/_sum/_count lines of a
  // histogram (either way round); for histograms also the label name "le",
  // bounds not strictly ascending, NaN or -Inf. A trailing +Inf bound is
  // dropped: the +Inf bucket is always rendered.
  Result<CounterFamily*> AddCounter(const std::string& name, const std::string& help,
                                    const std::vector<std::string>& label_names);
  Result<GaugeFamily*> AddGauge(const std::string& name, const std::string& help,
                                const std::vector<std::string>& label_names);
  Result<HistogramFamily*> AddHistogram(const std::string& name, const std::string& help,
                                        const std::vector<std::string>& label_names,
                                        std::vector<double> upper_bounds);

  // Every family in registration order, as text exposition format 0.0.4;
  // each line ends with '\n'. A family with no series renders only its
  // # HELP and # TYPE lines.
  std::string RenderPrometheus() const;

 private:
  Status CheckNewFamily(const std::string& name, const std::string& help, MetricType type,
                        const std::vector<std::string>& label_names) const;

  struct Entry {
    MetricType type;
    std::string name;
    std::unique_ptr<CounterFamily> counter;
    std::unique_ptr<GaugeFamily> gauge;
    std::unique_ptr<HistogramFamily> histogram;
  };

  mutable std::mutex mu_;
  std::vector<Entry> families_;  // guarded by mu_; registration order
};

}  // namespace headway
