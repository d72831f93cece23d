#include "bench/serving/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

namespace headway::bench {

std::vector<double> ArrivalTimes(int num_requests, double request_rate, uint64_t seed) {
  std::vector<double> times(std::max(num_requests, 0), 0.0);
  if (std::isinf(request_rate)) return times;
  // A stream of its own, so that arrivals do not shift when prompts change.
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> gap(request_rate);
  double t = 0;
  for (double& time : times) {
    t += gap(rng);
    time = t;
  }
  return times;
}

RunResult RunBenchmark(const RequestTarget& target, const std::vector<BenchPrompt>& prompts,
                       double request_rate, int max_in_flight, uint64_t seed) {
  const int n = int(prompts.size());
  RunResult run;
  run.outputs.resize(n);
  const std::vector<double> arrivals = ArrivalTimes(n, request_rate, seed);

  // Slots take the next request in order, so request i is sent once it is due
  // and a slot is free, like vLLM's semaphore over tasks created in order.
  std::mutex mu;
  int next = 0;  // guarded by mu
  const double start_s = NowSeconds();
  auto slot = [&]() {
    while (true) {
      int i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= n) return;
        i = next++;
        // Sleeping under the lock keeps the order: the next slot cannot take
        // request i+1 before request i is sent.
        double wait_s = start_s + arrivals[i] - NowSeconds();
        if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
      }
      run.outputs[i] = SendStreamingRequest(target, prompts[i], start_s);
    }
  };

  const int num_slots = std::max(1, std::min(max_in_flight, n));
  std::vector<std::thread> threads;
  threads.reserve(num_slots);
  for (int s = 0; s < num_slots; ++s) threads.emplace_back(slot);
  for (std::thread& t : threads) t.join();
  run.duration_s = NowSeconds() - start_s;
  return run;
}

}  // namespace headway::bench
