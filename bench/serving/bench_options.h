// BenchOptions: what one headway-bench run does, after flag parsing.
//
// The flags and their defaults follow `vllm bench serve` (random dataset,
// openai backend) so that a command line carries over between engines.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace headway::bench {

inline constexpr double kInfiniteRequestRate = std::numeric_limits<double>::infinity();

// The metric names accepted by --percentile-metrics.
inline const std::vector<std::string>& KnownPercentileMetrics() {
  static const std::vector<std::string> kNames = {"ttft", "tpot", "itl", "e2el"};
  return kNames;
}

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";  // scheme://host[:port][/prefix]
  std::string endpoint = "/v1/completions";        // or /v1/chat/completions
  std::string model;                               // empty: first id of GET /v1/models
  std::string api_key;                             // empty: no Authorization header
  int num_prompts = 1000;
  int random_input_len = 1024;   // tokens after the shared prefix
  int random_output_len = 128;   // max_tokens of every request
  int random_prefix_len = 0;     // tokens shared by every prompt, before the random part
  double request_rate = kInfiniteRequestRate;  // requests/s, Poisson; inf: all at time 0
  std::optional<int> max_concurrency;          // in-flight cap; none: kDefaultMaxThreads
  bool ignore_eos = false;
  uint64_t seed = 0;
  bool save_result = false;
  std::string result_filename;  // empty: vLLM-style name in the working directory
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> metric_percentiles = {99.0};  // each in (0, 100]
  double request_timeout_s = 3600.0;  // longest wait for any read on a stream
};

// When neither --max-concurrency nor a finite rate bounds the in-flight
// requests, at most this many are sent at once (one thread each).
inline constexpr int kDefaultMaxThreads = 256;

// True when the endpoint takes `messages` (…/chat/completions) rather than
// `prompt`.
bool IsChatEndpoint(const std::string& endpoint);

// Checks ranges and combinations. Returns InvalidArgument naming the flag.
Status ValidateBenchOptions(const BenchOptions& options);

// "ttft,tpot" -> {"ttft", "tpot"}. InvalidArgument on an unknown or empty name.
Result<std::vector<std::string>> ParsePercentileMetrics(const std::string& text);

// "50,90,99.9" -> {50, 90, 99.9}. InvalidArgument unless each is in (0, 100].
Result<std::vector<double>> ParseMetricPercentiles(const std::string& text);

// "inf" / "infinity" or a positive number -> requests per second.
Result<double> ParseRequestRate(const std::string& text);

// A base URL split for the HTTP client: "http://h:8000/x" -> {"http://h:8000", "/x"}.
struct BaseUrl {
  std::string scheme_host_port;  // what httplib::Client takes
  std::string path_prefix;       // "" or "/x" (no trailing slash), put before endpoints
};

// InvalidArgument for a scheme other than http (TLS is not built in), an
// empty host, or a malformed port.
Result<BaseUrl> ParseBaseUrl(const std::string& url);

}  // namespace headway::bench
