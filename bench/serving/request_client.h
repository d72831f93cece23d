// One streamed OpenAI request and what the benchmark measures of it.
//
// Timing follows vLLM's benchmark request functions
// (vllm/benchmarks/lib/endpoint_request_func.py): TTFT is the time from
// sending the request to the first chunk with non-empty content, ITL the gap
// between consecutive content chunks, E2EL the time to the last content
// chunk. The output token count comes from the usage chunk
// (stream_options.include_usage) when the server sends one, else it is the
// number of content chunks.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serving/prompt_generator.h"

namespace headway::bench {

// Where and how requests are sent; constant for a run.
struct RequestTarget {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string path;              // prefix + endpoint, "/v1/completions"
  bool chat = false;             // body has `messages` instead of `prompt`
  std::string model;
  std::string api_key;           // empty: no Authorization header
  bool ignore_eos = false;
  double timeout_s = 3600.0;     // connect, read and write timeout
};

struct RequestOutput {
  bool success = false;
  std::string error;             // empty on success
  int prompt_len = 0;            // usage.prompt_tokens if sent, else the intended length
  int output_tokens = 0;
  double start_s = 0;            // send time, seconds since the run began
  double ttft_s = 0;
  double latency_s = 0;          // E2EL
  std::vector<double> itl_s;     // one gap per content chunk after the first
  std::string generated_text;
};

// The JSON body for `prompt`: stream with usage, max_tokens = output_len,
// temperature 0, ignore_eos as configured.
nlohmann::json BuildRequestBody(const RequestTarget& target, const BenchPrompt& prompt);

// Sends one streaming request and reads the stream to its end. Never fails
// as a call: an HTTP error status, a transport error, an `error` event, a
// malformed chunk, a stream without `data: [DONE]` or without any content
// make `success` false with a message in `error`. `run_start_s`
// (a NowSeconds() value) anchors start_s. Thread-safe: each call opens its
// own connection, whose setup counts in TTFT (on loopback, well under 1 ms).
RequestOutput SendStreamingRequest(const RequestTarget& target, const BenchPrompt& prompt,
                                   double run_start_s);

// Seconds on the steady clock, for run_start_s and durations.
double NowSeconds();

}  // namespace headway::bench
