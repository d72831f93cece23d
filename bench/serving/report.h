// The benchmark's report: the summary table and the result JSON, both in the
// layout and with the field names of `vllm bench serve`, so that results
// from Headway and from vLLM or SGLang can be read by the same scripts.
//
// JSON fields: date, backend ("headway"), endpoint, model_id, num_prompts,
// request_rate ("inf" or a number), burstiness, max_concurrency (null or an
// integer), random_input_len, random_output_len, random_prefix_len,
// ignore_eos, seed, duration, completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput,
// total_token_throughput, max_output_tokens_per_s, max_concurrent_requests,
// mean_/median_/std_/p<P>_ {ttft,tpot,itl,e2el} _ms for the selected metrics,
// and per-request arrays input_lens, output_lens, ttfts (s), itls (s, one
// list per request), generated_texts, errors ("" on success), plus
// error_samples: the first distinct error messages.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/serving/bench_options.h"
#include "bench/serving/metrics.h"
#include "bench/serving/runner.h"

namespace headway::bench {

// How many distinct error messages the summary and error_samples show.
inline constexpr int kMaxErrorSamples = 5;

// Writes the "============ Serving Benchmark Result ============" table.
void PrintSummary(std::ostream& out, const BenchOptions& options, const RunResult& run,
                  const BenchmarkMetrics& metrics);

// The result JSON. `date` is "YYYYmmdd-HHMMSS" local time, as vLLM writes it.
nlohmann::json BuildResultJson(const BenchOptions& options, const std::string& model_id,
                               const std::string& date, const RunResult& run,
                               const BenchmarkMetrics& metrics);

// vLLM's default file name:
// "headway-<rate>qps[-concurrency<N>]-<model basename>-<date>.json".
std::string DefaultResultFilename(const BenchOptions& options, const std::string& model_id,
                                  const std::string& date);

}  // namespace headway::bench
