// Benchmark metrics over request outputs, computed as `vllm bench serve`
// computes them (vllm/benchmarks/serve.py, calculate_metrics), so that the
// figures compare directly:
//   * totals and latencies count completed requests only;
//   * TPOT per request = (E2EL - TTFT) / (output_tokens - 1), for requests
//     with more than one output token;
//   * ITL pools the gaps of all completed requests;
//   * std is the population standard deviation (numpy.std), percentiles
//     interpolate linearly between order statistics (numpy.percentile);
//   * a statistic over no samples is 0.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "bench/serving/request_client.h"

namespace headway::bench {

struct MetricSummary {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (percentile, value)
};

struct BenchmarkMetrics {
  int completed = 0;
  int failed = 0;
  long long total_input = 0;   // prompt tokens of completed requests
  long long total_output = 0;  // output tokens of completed requests
  double request_throughput = 0;      // completed / duration, requests/s
  double output_throughput = 0;       // total_output / duration, tokens/s
  double total_token_throughput = 0;  // (total_input + total_output) / duration
  double max_output_tokens_per_s = 0;  // most content chunks received in one 1 s bucket
  int max_concurrent_requests = 0;     // most requests in flight at once
  MetricSummary ttft, tpot, itl, e2el;
};

// numpy.percentile(values, p) with linear interpolation; 0 for no values.
// REQUIRES: 0 <= p <= 100.
double Percentile(std::vector<double> values, double p);

// Mean, median, population std and the given percentiles of `values_s`
// (seconds), reported in milliseconds.
MetricSummary Summarize(const std::vector<double>& values_s, const std::vector<double>& percentiles);

// The run's metrics. `duration_s` is the wall time of the whole run.
// REQUIRES: duration_s > 0.
BenchmarkMetrics ComputeMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                const std::vector<double>& percentiles);

}  // namespace headway::bench
