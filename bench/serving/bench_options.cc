#include "bench/serving/bench_options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace headway::bench {
namespace {

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    parts.push_back(part);
  }
  return parts;
}

// Whole-string number parse; std::stod alone accepts "12abc".
std::optional<double> ParseNumber(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || std::isnan(value)) return std::nullopt;
  return value;
}

}  // namespace

bool IsChatEndpoint(const std::string& endpoint) {
  const std::string suffix = "chat/completions";
  return endpoint.size() >= suffix.size() &&
         endpoint.compare(endpoint.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status ValidateBenchOptions(const BenchOptions& o) {
  if (o.num_prompts < 1) {
    return Status::InvalidArgument("--num-prompts must be at least 1, got " +
                                   std::to_string(o.num_prompts));
  }
  if (o.random_input_len < 0 || o.random_prefix_len < 0) {
    return Status::InvalidArgument("--random-input-len and --random-prefix-len must be >= 0");
  }
  if (o.random_input_len + o.random_prefix_len < 1) {
    return Status::InvalidArgument(
        "prompts would be empty: --random-input-len + --random-prefix-len must be at least 1");
  }
  if (o.random_output_len < 1) {
    return Status::InvalidArgument("--random-output-len must be at least 1, got " +
                                   std::to_string(o.random_output_len));
  }
  if (!(o.request_rate > 0)) {
    return Status::InvalidArgument("--request-rate must be positive or inf");
  }
  if (o.max_concurrency && *o.max_concurrency < 1) {
    return Status::InvalidArgument("--max-concurrency must be at least 1, got " +
                                   std::to_string(*o.max_concurrency));
  }
  if (o.endpoint.empty() || o.endpoint[0] != '/') {
    return Status::InvalidArgument("--endpoint must start with '/', got '" + o.endpoint + "'");
  }
  if (!(o.request_timeout_s > 0)) {
    return Status::InvalidArgument("--request-timeout-s must be positive");
  }
  Result<BaseUrl> url = ParseBaseUrl(o.base_url);
  if (!url.ok()) return url.status();
  return Status::Ok();
}

Result<std::vector<std::string>> ParsePercentileMetrics(const std::string& text) {
  std::vector<std::string> names;
  for (const std::string& name : SplitCommas(text)) {
    const auto& known = KnownPercentileMetrics();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return Status::InvalidArgument("--percentile-metrics: unknown metric '" + name +
                                     "' (known: ttft, tpot, itl, e2el)");
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.empty()) return Status::InvalidArgument("--percentile-metrics is empty");
  return names;
}

Result<std::vector<double>> ParseMetricPercentiles(const std::string& text) {
  std::vector<double> percentiles;
  for (const std::string& part : SplitCommas(text)) {
    std::optional<double> p = ParseNumber(part);
    if (!p || *p <= 0 || *p > 100) {
      return Status::InvalidArgument("--metric-percentiles: '" + part +
                                     "' is not a number in (0, 100]");
    }
    percentiles.push_back(*p);
  }
  if (percentiles.empty()) return Status::InvalidArgument("--metric-percentiles is empty");
  return percentiles;
}

Result<double> ParseRequestRate(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (lower == "inf" || lower == "infinity") return kInfiniteRequestRate;
  std::optional<double> rate = ParseNumber(text);
  if (!rate || !(*rate > 0)) {
    return Status::InvalidArgument("--request-rate: '" + text + "' is not a positive number or inf");
  }
  return *rate;
}

Result<BaseUrl> ParseBaseUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return Status::InvalidArgument("--base-url must start with http:// (TLS is not supported), got '" +
                                   url + "'");
  }
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string host_port = rest.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (host_port.empty()) return Status::InvalidArgument("--base-url has no host: '" + url + "'");
  size_t colon = host_port.rfind(':');
  if (colon != std::string::npos && host_port.find(']') == std::string::npos) {
    std::string port = host_port.substr(colon + 1);
    bool digits = !port.empty() && port.size() <= 5 &&
                  std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return Status::InvalidArgument("--base-url has a bad port: '" + url + "'");
    }
    if (colon == 0) return Status::InvalidArgument("--base-url has no host: '" + url + "'");
  }
  return BaseUrl{scheme + host_port, prefix};
}

}  // namespace headway::bench
