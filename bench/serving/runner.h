// Runs the benchmark's requests: arrivals and concurrency as in
// `vllm bench serve`.
//
// Request i becomes due at its arrival time: 0 for every request when the
// rate is infinite, else the sum of i+1 exponential gaps of mean 1/rate (a
// Poisson process, seeded). It is sent when it is due and one of `max_in_flight`
// slots is free; requests go out in order. Each slot is one thread that
// runs one request at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/serving/prompt_generator.h"
#include "bench/serving/request_client.h"

namespace headway::bench {

struct RunResult {
  std::vector<RequestOutput> outputs;  // one per prompt, in prompt order
  double duration_s = 0;               // first send to last response
};

// Arrival offsets in seconds from the start, non-decreasing, one per request.
// `request_rate` in requests/s; infinite -> all zero. REQUIRES: request_rate > 0.
std::vector<double> ArrivalTimes(int num_requests, double request_rate, uint64_t seed);

// Sends every prompt to `target` and waits for all of them.
// REQUIRES: max_in_flight >= 1. Blocks until the run ends; returns no error
// (failed requests are recorded in their outputs).
RunResult RunBenchmark(const RequestTarget& target, const std::vector<BenchPrompt>& prompts,
                       double request_rate, int max_in_flight, uint64_t seed);

}  // namespace headway::bench
