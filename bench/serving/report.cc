#include "bench/serving/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace headway::bench {
namespace {

using nlohmann::json;

// Python's repr of a float: the shortest round-trip digits.
std::string PythonFloat(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  std::string text(buf, end);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

// vLLM's percentile key: "99" for 99.0, "99.9" for 99.9.
std::string PercentileWord(double p) {
  if (std::floor(p) == p) return std::to_string((long long)p);
  return PythonFloat(p);
}

void Row(std::ostream& out, const std::string& label, const std::string& value) {
  char line[128];
  std::snprintf(line, sizeof(line), "%-40s %-10s", label.c_str(), value.c_str());
  out << line << "\n";
}

std::string Fixed2(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", value);
  return buf;
}

std::string Centered(const std::string& title, char fill) {
  const size_t width = 50;
  if (title.size() >= width) return title;
  size_t left = (width - title.size()) / 2;  // Python's str.format '^' puts the odd one right
  return std::string(left, fill) + title + std::string(width - title.size() - left, fill);
}

struct MetricInfo {
  const char* key;
  const char* name;
  const char* header;
  const MetricSummary BenchmarkMetrics::*summary;
};

constexpr MetricInfo kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token", &BenchmarkMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &BenchmarkMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &BenchmarkMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &BenchmarkMetrics::e2el},
};

bool Selected(const BenchOptions& options, const char* key) {
  for (const std::string& name : options.percentile_metrics) {
    if (name == key) return true;
  }
  return false;
}

std::vector<std::string> ErrorSamples(const RunResult& run) {
  std::vector<std::string> samples;
  for (const RequestOutput& o : run.outputs) {
    if (o.success || o.error.empty()) continue;
    if (std::find(samples.begin(), samples.end(), o.error) != samples.end()) continue;
    samples.push_back(o.error);
    if (int(samples.size()) == kMaxErrorSamples) break;
  }
  return samples;
}

}  // namespace

void PrintSummary(std::ostream& out, const BenchOptions& options, const RunResult& run,
                  const BenchmarkMetrics& m) {
  out << Centered(" Serving Benchmark Result ", '=') << "\n";
  Row(out, "Successful requests:", std::to_string(m.completed));
  Row(out, "Failed requests:", std::to_string(m.failed));
  if (options.max_concurrency) {
    Row(out, "Maximum request concurrency:", std::to_string(*options.max_concurrency));
  }
  if (!std::isinf(options.request_rate)) {
    Row(out, "Request rate configured (RPS):", Fixed2(options.request_rate));
  }
  Row(out, "Benchmark duration (s):", Fixed2(run.duration_s));
  Row(out, "Total input tokens:", std::to_string(m.total_input));
  Row(out, "Total generated tokens:", std::to_string(m.total_output));
  Row(out, "Request throughput (req/s):", Fixed2(m.request_throughput));
  Row(out, "Output token throughput (tok/s):", Fixed2(m.output_throughput));
  Row(out, "Peak output token throughput (tok/s):", Fixed2(m.max_output_tokens_per_s));
  Row(out, "Peak concurrent requests:", Fixed2(m.max_concurrent_requests));
  Row(out, "Total token throughput (tok/s):", Fixed2(m.total_token_throughput));
  for (const MetricInfo& info : kMetrics) {
    if (!Selected(options, info.key)) continue;
    const MetricSummary& s = m.*info.summary;
    out << Centered(info.header, '-') << "\n";
    Row(out, std::string("Mean ") + info.name + " (ms):", Fixed2(s.mean_ms));
    Row(out, std::string("Median ") + info.name + " (ms):", Fixed2(s.median_ms));
    for (const auto& [p, value] : s.percentiles_ms) {
      Row(out, "P" + PercentileWord(p) + " " + info.name + " (ms):", Fixed2(value));
    }
  }
  out << std::string(50, '=') << "\n";
  std::vector<std::string> samples = ErrorSamples(run);
  if (!samples.empty()) {
    out << "First errors:\n";
    for (const std::string& e : samples) out << "  " << e << "\n";
  }
}

json BuildResultJson(const BenchOptions& options, const std::string& model_id,
                     const std::string& date, const RunResult& run, const BenchmarkMetrics& m) {
  json result;
  result["date"] = date;
  result["backend"] = "headway";
  result["endpoint"] = options.endpoint;
  result["model_id"] = model_id;
  result["num_prompts"] = options.num_prompts;
  result["request_rate"] = std::isinf(options.request_rate) ? json("inf") : json(options.request_rate);
  result["burstiness"] = 1.0;
  result["max_concurrency"] = options.max_concurrency ? json(*options.max_concurrency) : json(nullptr);
  result["random_input_len"] = options.random_input_len;
  result["random_output_len"] = options.random_output_len;
  result["random_prefix_len"] = options.random_prefix_len;
  result["ignore_eos"] = options.ignore_eos;
  result["seed"] = options.seed;
  result["duration"] = run.duration_s;
  result["completed"] = m.completed;
  result["failed"] = m.failed;
  result["total_input_tokens"] = m.total_input;
  result["total_output_tokens"] = m.total_output;
  result["request_throughput"] = m.request_throughput;
  result["request_goodput"] = nullptr;
  result["output_throughput"] = m.output_throughput;
  result["total_token_throughput"] = m.total_token_throughput;
  result["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  result["max_concurrent_requests"] = m.max_concurrent_requests;

  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), texts = json::array(), errors = json::array();
  for (const RequestOutput& o : run.outputs) {
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.success ? o.output_tokens : 0);
    ttfts.push_back(o.ttft_s);
    itls.push_back(o.itl_s);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  result["input_lens"] = std::move(input_lens);
  result["output_lens"] = std::move(output_lens);
  result["ttfts"] = std::move(ttfts);
  result["itls"] = std::move(itls);
  result["generated_texts"] = std::move(texts);
  result["errors"] = std::move(errors);
  result["error_samples"] = ErrorSamples(run);

  for (const MetricInfo& info : kMetrics) {
    if (!Selected(options, info.key)) continue;
    const MetricSummary& s = m.*info.summary;
    std::string key = info.key;
    result["mean_" + key + "_ms"] = s.mean_ms;
    result["median_" + key + "_ms"] = s.median_ms;
    result["std_" + key + "_ms"] = s.std_ms;
    for (const auto& [p, value] : s.percentiles_ms) {
      result["p" + PercentileWord(p) + "_" + key + "_ms"] = value;
    }
  }
  return result;
}

std::string DefaultResultFilename(const BenchOptions& options, const std::string& model_id,
                                  const std::string& date) {
  std::string base_model = model_id.substr(model_id.find_last_of('/') + 1);
  std::string name = "headway-" + PythonFloat(options.request_rate) + "qps";
  if (options.max_concurrency) name += "-concurrency" + std::to_string(*options.max_concurrency);
  return name + "-" + base_model + "-" + date + ".json";
}

}  // namespace headway::bench
