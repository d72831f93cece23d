#include "bench/serving/metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace headway::bench {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double rank = p / 100.0 * double(values.size() - 1);
  size_t lower = size_t(std::floor(rank));
  size_t upper = std::min(lower + 1, values.size() - 1);
  double fraction = rank - double(lower);
  return values[lower] + (values[upper] - values[lower]) * fraction;
}

MetricSummary Summarize(const std::vector<double>& values_s, const std::vector<double>& percentiles) {
  MetricSummary summary;
  if (!values_s.empty()) {
    double n = double(values_s.size());
    double mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
    double sum_sq = 0;
    for (double v : values_s) sum_sq += (v - mean) * (v - mean);
    summary.mean_ms = mean * 1000.0;
    summary.std_ms = std::sqrt(sum_sq / n) * 1000.0;
    summary.median_ms = Percentile(values_s, 50) * 1000.0;
  }
  for (double p : percentiles) {
    summary.percentiles_ms.emplace_back(p, Percentile(values_s, p) * 1000.0);
  }
  return summary;
}

namespace {

// Peak in-flight requests: sweep of +1 at each start, -1 at each end.
int MaxConcurrent(const std::vector<RequestOutput>& outputs) {
  std::vector<std::pair<double, int>> events;
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    events.emplace_back(o.start_s, +1);
    events.emplace_back(o.start_s + o.latency_s, -1);
  }
  // At equal times an end sorts before a start: touching intervals do not overlap.
  std::sort(events.begin(), events.end());
  int current = 0, peak = 0;
  for (const auto& [time, delta] : events) {
    current += delta;
    peak = std::max(peak, current);
  }
  return peak;
}

// Most content chunks arriving within one whole second of the run.
double MaxOutputTokensPerSecond(const std::vector<RequestOutput>& outputs) {
  std::map<long long, int> per_second;
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    double t = o.start_s + o.ttft_s;
    ++per_second[(long long)std::floor(t)];
    for (double gap : o.itl_s) {
      t += gap;
      ++per_second[(long long)std::floor(t)];
    }
  }
  int peak = 0;
  for (const auto& [second, count] : per_second) peak = std::max(peak, count);
  return peak;
}

}  // namespace

BenchmarkMetrics ComputeMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                const std::vector<double>& percentiles) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestOutput& o : outputs) {
    if (!o.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += o.prompt_len;
    m.total_output += o.output_tokens;
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.latency_s);
    itls.insert(itls.end(), o.itl_s.begin(), o.itl_s.end());
    if (o.output_tokens > 1) {
      tpots.push_back((o.latency_s - o.ttft_s) / double(o.output_tokens - 1));
    }
  }
  m.request_throughput = m.completed / duration_s;
  m.output_throughput = double(m.total_output) / duration_s;
  m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
  m.max_output_tokens_per_s = MaxOutputTokensPerSecond(outputs);
  m.max_concurrent_requests = MaxConcurrent(outputs);
  m.ttft = Summarize(ttfts, percentiles);
  m.tpot = Summarize(tpots, percentiles);
  m.itl = Summarize(itls, percentiles);
  m.e2el = Summarize(e2els, percentiles);
  return m;
}

}  // namespace headway::bench
