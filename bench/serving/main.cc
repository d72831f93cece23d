// headway-bench: a serving benchmark for OpenAI-compatible servers, with the
// flags, summary and result JSON of `vllm bench serve` (random dataset).
//
//   headway-bench --base-url http://127.0.0.1:8000 --num-prompts 200
//     --random-input-len 256 --random-output-len 128 --max-concurrency 8
//     --ignore-eos --save-result
//
// Exit status: 0 when the run finished (failed requests are counted, not
// fatal); 1 for bad flags or an unwritable result file; 2 when the server
// cannot be reached or no model can be determined.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>

#include "bench/serving/bench_options.h"
#include "bench/serving/metrics.h"
#include "bench/serving/prompt_generator.h"
#include "bench/serving/report.h"
#include "bench/serving/request_client.h"
#include "bench/serving/runner.h"

namespace headway::bench {
namespace {

constexpr int kExitBadFlags = 1;
constexpr int kExitUnreachable = 2;

// Asks GET <prefix>/v1/models, which also proves the server is up. Returns
// the first model id, or `options.model` when given. Unavailable when the
// server cannot be reached; NotFound when no model can be determined.
Result<std::string> ResolveModel(const BenchOptions& options, const BaseUrl& url) {
  httplib::Client client(url.scheme_host_port);
  client.set_connection_timeout(std::chrono::seconds(10));
  client.set_read_timeout(std::chrono::seconds(60));
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  httplib::Result res = client.Get(url.path_prefix + "/v1/models", headers);
  if (!res) {
    return Status::Unavailable("cannot reach " + options.base_url + ": " +
                               httplib::to_string(res.error()));
  }
  if (!options.model.empty()) return options.model;
  if (res->status != 200) {
    return Status::NotFound("GET /v1/models answered HTTP " + std::to_string(res->status) + ": " +
                            res->body.substr(0, 500) + " (pass --model)");
  }
  nlohmann::json body = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("data") && body["data"].is_array() &&
      !body["data"].empty() && body["data"][0].is_object() && body["data"][0].contains("id") &&
      body["data"][0]["id"].is_string()) {
    return body["data"][0]["id"].get<std::string>();
  }
  return Status::NotFound("GET /v1/models listed no model id (pass --model)");
}

std::string LocalDate() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &local);
  return buf;
}

int Run(int argc, char** argv, const char* env_api_key) {
  BenchOptions options;
  if (env_api_key) options.api_key = env_api_key;
  std::string request_rate = "inf";
  std::string percentile_metrics = "ttft,tpot,itl,e2el";
  std::string metric_percentiles = "99";
  int max_concurrency = 0;

  CLI::App app{"headway-bench: serving benchmark for OpenAI-compatible servers "
               "(flags and results as `vllm bench serve`; API key from OPENAI_API_KEY)"};
  app.add_option("--base-url", options.base_url, "server URL")->capture_default_str();
  app.add_option("--endpoint", options.endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  app.add_option("--model", options.model, "model name (default: first of GET /v1/models)");
  app.add_option("--num-prompts", options.num_prompts, "requests to send")->capture_default_str();
  app.add_option("--random-input-len", options.random_input_len,
                 "random tokens per prompt, after the shared prefix")->capture_default_str();
  app.add_option("--random-output-len", options.random_output_len, "max_tokens per request")
      ->capture_default_str();
  app.add_option("--random-prefix-len", options.random_prefix_len,
                 "tokens shared by the start of every prompt")->capture_default_str();
  app.add_option("--request-rate", request_rate, "requests/s (Poisson arrivals), or inf")
      ->capture_default_str();
  CLI::Option* concurrency_flag =
      app.add_option("--max-concurrency", max_concurrency, "most requests in flight at once");
  app.add_flag("--ignore-eos", options.ignore_eos, "send ignore_eos: generate max_tokens tokens");
  app.add_option("--seed", options.seed, "seed for prompts and arrivals")->capture_default_str();
  app.add_flag("--save-result", options.save_result, "save the result JSON");
  app.add_option("--result-filename", options.result_filename,
                 "result JSON path (implies --save-result)");
  app.add_option("--percentile-metrics", percentile_metrics, "of ttft,tpot,itl,e2el")
      ->capture_default_str();
  app.add_option("--metric-percentiles", metric_percentiles, "comma-separated, e.g. 50,90,99")
      ->capture_default_str();
  app.add_option("--request-timeout-s", options.request_timeout_s,
                 "longest wait for any read on one request")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadFlags;
  }

  if (concurrency_flag->count() > 0) options.max_concurrency = max_concurrency;
  if (!options.result_filename.empty()) options.save_result = true;
  Result<double> rate = ParseRequestRate(request_rate);
  Result<std::vector<std::string>> metrics_names = ParsePercentileMetrics(percentile_metrics);
  Result<std::vector<double>> percentiles = ParseMetricPercentiles(metric_percentiles);
  for (const Status& s : {rate.status(), metrics_names.status(), percentiles.status()}) {
    if (!s.ok()) {
      std::cerr << "headway-bench: " << s.message() << "\n";
      return kExitBadFlags;
    }
  }
  options.request_rate = *rate;
  options.percentile_metrics = *metrics_names;
  options.metric_percentiles = *percentiles;
  if (Status s = ValidateBenchOptions(options); !s.ok()) {
    std::cerr << "headway-bench: " << s.message() << "\n";
    return kExitBadFlags;
  }
  BaseUrl url = ParseBaseUrl(options.base_url).value();

  Result<std::string> model = ResolveModel(options, url);
  if (!model.ok()) {
    std::cerr << "headway-bench: " << model.status().message() << "\n";
    return kExitUnreachable;
  }

  RequestTarget target;
  target.scheme_host_port = url.scheme_host_port;
  target.path = url.path_prefix + options.endpoint;
  target.chat = IsChatEndpoint(options.endpoint);
  target.model = *model;
  target.api_key = options.api_key;
  target.ignore_eos = options.ignore_eos;
  target.timeout_s = options.request_timeout_s;

  std::vector<BenchPrompt> prompts =
      GeneratePrompts(options.num_prompts, options.random_prefix_len, options.random_input_len,
                      options.random_output_len, target.chat, options.seed);
  const int max_in_flight = options.max_concurrency.value_or(kDefaultMaxThreads);

  std::cout << "Model: " << *model << "\n";
  std::cout << "Starting main benchmark run...\n";
  std::cout << "Traffic request rate: " << request_rate << "\n";
  std::cout << "Burstiness factor: 1.0 (Poisson process)\n";
  std::cout << "Maximum request concurrency: "
            << (options.max_concurrency ? std::to_string(*options.max_concurrency) : "None")
            << "\n"
            << std::flush;

  RunResult run = RunBenchmark(target, prompts, options.request_rate, max_in_flight, options.seed);
  BenchmarkMetrics metrics = ComputeMetrics(run.outputs, run.duration_s, options.metric_percentiles);
  PrintSummary(std::cout, options, run, metrics);

  if (options.save_result) {
    std::string date = LocalDate();
    std::string path = options.result_filename.empty()
                           ? DefaultResultFilename(options, *model, date)
                           : options.result_filename;
    std::ofstream file(path);
    file << BuildResultJson(options, *model, date, run, metrics).dump(2) << "\n";
    file.close();
    if (!file) {
      std::cerr << "headway-bench: cannot write " << path << "\n";
      return kExitBadFlags;
    }
    std::cout << "Saved result to " << path << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace headway::bench

int main(int argc, char** argv) {
  return headway::bench::Run(argc, argv, std::getenv("OPENAI_API_KEY"));
}
