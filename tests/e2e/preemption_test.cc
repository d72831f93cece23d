// End to end: a KV pool far too small for the load. The scheduler must
// preempt (release the newest running sequences' blocks and recompute them
// later) instead of failing or hanging, every request must still get the
// greedy answer it gets alone, and a request that can never fit must get a
// clear error at once.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

// 3 MiB per worker at block_size 16: 768 blocks of 4 KiB (16 positions x
// 64 x K,V x f16, the default KV cache dtype); SmolLM2 at TP 1 has 30
// layers x 3 KV heads = 90 slots, so 8 logical blocks = 128 positions for
// all sequences together.
constexpr int kKvMemoryMb = 3;
constexpr int kNumBlocks = 768;
constexpr int kMaxPositions = 8 * 16;
// Each request grows to about 35 + 32 positions (5 logical blocks, of which
// 2 hold the shared system turn): only two run at once.
constexpr int kMaxTokens = 32;
constexpr int kNumRequests = 8;

const std::vector<std::string>& Questions() {
  static const std::vector<std::string> q = {
      "What is the capital of France?", "Write one sentence about the sea.",
      "List three colours.",            "Why is the sky blue?",
      "Name a big animal.",             "What is rain?",
      "Count from one to five.",        "Describe a cat."};
  return q;
}

json Greedy(const std::string& prompt, int max_tokens) {
  return json{{"model", "smollm2"},
              {"prompt", prompt},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true}};
}

std::string Complete(const Deployment& d, const std::string& prompt) {
  HttpReply r = d.PostJson("/v1/completions", Greedy(prompt, kMaxTokens));
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return "<error " + std::to_string(r.status) + ">";
  EXPECT_EQ(r.json["usage"]["completion_tokens"].get<int>(), kMaxTokens);
  return r.json["choices"][0]["text"].get<std::string>();
}

int CountOccurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(PreemptionE2eTest, SmallPoolPreemptsAndEveryRequestGetsItsAloneAnswer) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.kv_memory_mb = kKvMemoryMb;
  options.block_size = 16;
  // Admission by first chunk, so that requests start and later run short
  // (the default reserves whole footprints and would run one at a time).
  options.admission_policy = "max_utilization";
  std::string error;
  auto d = Deployment::Start(options, &error);
  ASSERT_NE(d, nullptr) << error;
  const long free_at_start = d->FreeBlocks();
  ASSERT_EQ(free_at_start, kNumBlocks);

  // A request that could never fit the pool fails at once with a clear
  // error instead of waiting forever.
  HttpReply too_big = d->PostJson("/v1/completions", Greedy("Hello", kMaxPositions + 1));
  EXPECT_EQ(too_big.status, 400) << too_big.body;
  EXPECT_NE(too_big.body.find("kv_memory_mb"), std::string::npos) << too_big.body;

  std::vector<std::string> alone;
  for (const std::string& q : Questions()) alone.push_back(Complete(*d, SmolLm2ChatPrompt(q)));
  EXPECT_EQ(CountOccurrences(d->Log(), "preempted sequence"), 0) << "one at a time fits";

  std::vector<std::future<std::string>> futures;
  for (int i = 0; i < kNumRequests; ++i) {
    std::string prompt = SmolLm2ChatPrompt(Questions()[i % Questions().size()]);
    futures.push_back(
        std::async(std::launch::async, [&d, prompt] { return Complete(*d, prompt); }));
  }
  for (int i = 0; i < kNumRequests; ++i) {
    EXPECT_EQ(futures[i].get(), alone[i % Questions().size()]) << "request " << i;
  }
  // The coordinator logs the first preemption and every 50th;
  // num_preemptions_total counts them all.
  EXPECT_GT(CountOccurrences(d->Log(), "preempted sequence"), 0) << d->Log();
  HttpReply metrics = d->Get("/metrics");
  Result<PromExposition> parsed = ParsePrometheusText(metrics.body);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::optional<double> preemptions = parsed->Value(
      "headway:num_preemptions_total", {{"model_name", "smollm2"}, {"instance", "0"}});
  ASSERT_TRUE(preemptions.has_value()) << metrics.body;
  EXPECT_GT(*preemptions, 0);
  EXPECT_EQ(d->FreeBlocks(), free_at_start);
}

}  // namespace
}  // namespace headway::testing
