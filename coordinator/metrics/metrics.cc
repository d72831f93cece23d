#include "coordinator/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <type_traits>

namespace headway {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}
bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || (c >= '0' && c <= '9');
}
bool IsValidName(std::string_view name, bool allow_colon) {
  if (name.empty() || !IsNameStart(name[0], allow_colon)) return false;
  for (char c : name) {
    if (!IsNameChar(c, allow_colon)) return false;
  }
  return true;
}

// HELP text escapes only backslash and newline (the format's rule).
std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
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

// `{a="x",b="y"}` with an optional extra pair last (a histogram's le), or ""
// when there are no labels at all.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     std::string_view extra_name = {}, std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += EscapeLabelValue(extra_value);
    out += '"';
  }
  out += '}';
  return out;
}

void AppendSample(std::string& out, const std::string& name, const std::string& labels,
                  const std::string& value) {
  out += name;
  out += labels;
  out += ' ';
  out += value;
  out += '\n';
}

void RenderSeries(std::string& out, const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Counter& c) {
  AppendSample(out, name, LabelSet(names, values), FormatMetricValue(c.value()));
}

void RenderSeries(std::string& out, const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Gauge& g) {
  AppendSample(out, name, LabelSet(names, values), FormatMetricValue(g.value()));
}

void RenderSeries(std::string& out, const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Histogram& h) {
  Histogram::Snapshot s = h.Read();
  const std::string bucket = name + "_bucket";
  for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
    std::string le = i < s.upper_bounds.size() ? FormatMetricValue(s.upper_bounds[i]) : "+Inf";
    AppendSample(out, bucket, LabelSet(names, values, "le", le),
                 std::to_string(s.cumulative_counts[i]));
  }
  AppendSample(out, name + "_sum", LabelSet(names, values), FormatMetricValue(s.sum));
  AppendSample(out, name + "_count", LabelSet(names, values), std::to_string(s.count));
}

template <typename Series>
MetricType TypeOf();
template <>
MetricType TypeOf<Counter>() { return MetricType::kCounter; }
template <>
MetricType TypeOf<Gauge>() { return MetricType::kGauge; }
template <>
MetricType TypeOf<Histogram>() { return MetricType::kHistogram; }

template <typename Series>
std::unique_ptr<Series> NewSeries(const std::vector<double>& upper_bounds) {
  if constexpr (std::is_same_v<Series, Histogram>) {
    return std::make_unique<Histogram>(upper_bounds);
  } else {
    return std::make_unique<Series>();
  }
}

// The sample names a family of `type` called `name` writes.
std::vector<std::string> SampleNames(const std::string& name, MetricType type) {
  if (type == MetricType::kHistogram) {
    return {name, name + "_bucket", name + "_sum", name + "_count"};
  }
  return {name};
}

}  // namespace

bool IsValidMetricName(std::string_view name) { return IsValidName(name, true); }

bool IsValidLabelName(std::string_view name) {
  return IsValidName(name, false) && name.substr(0, 2) != "__";
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
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

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) return "NaN";  // cannot happen with 64 bytes
  return std::string(buf, end);
}

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

Status Counter::Increment(double amount) {
  if (!(amount >= 0.0) || std::isinf(amount)) {
    return Status::InvalidArgument("counter increment must be finite and >= 0, got " +
                                   FormatMetricValue(amount));
  }
  value_.fetch_add(amount, std::memory_order_relaxed);
  return Status::Ok();
}

void Gauge::Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {}

Status Histogram::Observe(double value) {
  if (std::isnan(value)) return Status::InvalidArgument("histogram observation is NaN");
  // First bound >= value; past the end means the +Inf bucket.
  size_t i = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  ++bucket_counts_[i];
  sum_ += value;
  return Status::Ok();
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.upper_bounds = upper_bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  s.cumulative_counts.resize(bucket_counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < bucket_counts_.size(); ++i) {
    running += bucket_counts_[i];
    s.cumulative_counts[i] = running;
  }
  s.count = running;
  s.sum = sum_;
  return s;
}

template <typename Series>
MetricFamily<Series>::MetricFamily(std::string name, std::string help,
                                   std::vector<std::string> label_names,
                                   std::vector<double> upper_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

template <typename Series>
Result<Series*> MetricFamily<Series>::WithLabels(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names_.size()) {
    return Status::InvalidArgument("metric " + name_ + " takes " +
                                   std::to_string(label_names_.size()) + " label values, got " +
                                   std::to_string(label_values.size()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Series>& slot = series_[label_values];
  if (!slot) slot = NewSeries<Series>(upper_bounds_);
  return slot.get();
}

template <typename Series>
void MetricFamily<Series>::Render(std::string& out) const {
  out += "# HELP " + name_ + " " + EscapeHelp(help_) + "\n";
  out += "# TYPE " + name_ + " " + MetricTypeName(TypeOf<Series>()) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, series] : series_) {
    RenderSeries(out, name_, label_names_, values, *series);
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

Status MetricRegistry::CheckNewFamily(const std::string& name, const std::string& help,
                                      MetricType type,
                                      const std::vector<std::string>& label_names) const {
  if (!IsValidMetricName(name)) {
    return Status::InvalidArgument("invalid metric name '" + name +
                                   "': must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  if (help.empty()) {
    return Status::InvalidArgument("metric " + name + ": help text is empty");
  }
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label)) {
      return Status::InvalidArgument("metric " + name + ": invalid label name '" + label +
                                     "': must match [a-zA-Z_][a-zA-Z0-9_]* without a leading __");
    }
    if (!seen.insert(label).second) {
      return Status::InvalidArgument("metric " + name + ": label name '" + label + "' repeated");
    }
    if (type == MetricType::kHistogram && label == "le") {
      return Status::InvalidArgument("histogram " + name + ": label name 'le' is reserved");
    }
  }
  // Holds mu_ (the caller's lock).
  std::vector<std::string> mine = SampleNames(name, type);
  for (const Entry& e : families_) {
    for (const std::string& theirs : SampleNames(e.name, e.type)) {
      for (const std::string& n : mine) {
        if (n == theirs) {
          return Status::InvalidArgument("metric name " + name + " collides with registered " +
                                         MetricTypeName(e.type) + " " + e.name);
        }
      }
    }
  }
  return Status::Ok();
}

Result<CounterFamily*> MetricRegistry::AddCounter(const std::string& name, const std::string& help,
                                                  const std::vector<std::string>& label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  HW_RETURN_IF_ERROR(CheckNewFamily(name, help, MetricType::kCounter, label_names));
  Entry e{MetricType::kCounter, name, nullptr, nullptr, nullptr};
  e.counter = std::make_unique<CounterFamily>(name, help, label_names, std::vector<double>{});
  CounterFamily* out = e.counter.get();
  families_.push_back(std::move(e));
  return out;
}

Result<GaugeFamily*> MetricRegistry::AddGauge(const std::string& name, const std::string& help,
                                              const std::vector<std::string>& label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  HW_RETURN_IF_ERROR(CheckNewFamily(name, help, MetricType::kGauge, label_names));
  Entry e{MetricType::kGauge, name, nullptr, nullptr, nullptr};
  e.gauge = std::make_unique<GaugeFamily>(name, help, label_names, std::vector<double>{});
  GaugeFamily* out = e.gauge.get();
  families_.push_back(std::move(e));
  return out;
}

Result<HistogramFamily*> MetricRegistry::AddHistogram(const std::string& name,
                                                      const std::string& help,
                                                      const std::vector<std::string>& label_names,
                                                      std::vector<double> upper_bounds) {
  if (!upper_bounds.empty() && upper_bounds.back() == std::numeric_limits<double>::infinity()) {
    upper_bounds.pop_back();
  }
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return Status::InvalidArgument("histogram " + name + ": bucket bound " +
                                     FormatMetricValue(upper_bounds[i]) + " is not finite");
    }
    if (i > 0 && !(upper_bounds[i - 1] < upper_bounds[i])) {
      return Status::InvalidArgument("histogram " + name + ": bucket bounds must be strictly "
                                     "ascending, got " + FormatMetricValue(upper_bounds[i - 1]) +
                                     " then " + FormatMetricValue(upper_bounds[i]));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  HW_RETURN_IF_ERROR(CheckNewFamily(name, help, MetricType::kHistogram, label_names));
  Entry e{MetricType::kHistogram, name, nullptr, nullptr, nullptr};
  e.histogram = std::make_unique<HistogramFamily>(name, help, label_names, std::move(upper_bounds));
  HistogramFamily* out = e.histogram.get();
  families_.push_back(std::move(e));
  return out;
}

std::string MetricRegistry::RenderPrometheus() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : families_) {
    switch (e.type) {
      case MetricType::kCounter: e.counter->Render(out); break;
      case MetricType::kGauge: e.gauge->Render(out); break;
      case MetricType::kHistogram: e.histogram->Render(out); break;
    }
  }
  return out;
}

}  // namespace headway
