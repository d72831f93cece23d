// GET /metrics on a real deployment parses as Prometheus text exposition and
// its counters agree with the requests the test sent.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

TEST(MetricsE2eTest, CountersAgreeWithTheRequestsSent) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  std::string error;
  auto d = Deployment::Start(options, &error);
  ASSERT_NE(d, nullptr) << error;

  constexpr int kRequests = 3;
  constexpr int kMaxTokens = 5;
  long prompt_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    HttpReply r = d->PostJson(
        "/v1/completions",
        json{{"prompt", "Counting to ten: one, two, three" + std::string(i, '!')},
             {"max_tokens", kMaxTokens},
             {"temperature", 0},
             {"ignore_eos", true}});
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_EQ(r.json["usage"]["completion_tokens"], kMaxTokens);
    prompt_tokens += r.json["usage"]["prompt_tokens"].get<long>();
  }
  // A bad request is no request: it counts nowhere.
  ASSERT_EQ(d->PostJson("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 0}}).status, 400);

  const PromLabels labels{{"model_name", "smollm2"}, {"instance", "0"}};
  // One request at a time: its prompt in one step that samples its first
  // token, one decode step per further token, then a step that only tells
  // the workers to drop the finished sequence. The last of those may still
  // be on its way when the last answer is: scrape until it is in.
  constexpr int kSteps = kRequests * (kMaxTokens + 1);
  HttpReply m;
  Result<PromExposition> parsed = Status::Unavailable("not scraped");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    m = d->Get("/metrics");
    ASSERT_EQ(m.status, 200);
    parsed = ParsePrometheusText(m.body);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << m.body;
    if (parsed->Value("headway:step_seconds_count", labels).value_or(0) >= kSteps) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  auto value = [&](const std::string& name, PromLabels l) {
    std::optional<double> v = parsed->Value(name, l);
    EXPECT_TRUE(v.has_value()) << name;
    return v.value_or(-1);
  };
  EXPECT_EQ(value("headway:prompt_tokens_total", labels), prompt_tokens);
  EXPECT_EQ(value("headway:generation_tokens_total", labels), kRequests * kMaxTokens);
  PromLabels length = labels;
  length["finished_reason"] = "length";
  EXPECT_EQ(value("headway:request_success_total", length), kRequests);
  EXPECT_EQ(value("headway:time_to_first_token_seconds_count", labels), kRequests);
  EXPECT_EQ(value("headway:e2e_request_latency_seconds_count", labels), kRequests);
  EXPECT_EQ(value("headway:request_queue_time_seconds_count", labels), kRequests);
  EXPECT_EQ(value("headway:inter_token_latency_seconds_count", labels),
            kRequests * (kMaxTokens - 1));
  EXPECT_EQ(value("headway:step_seconds_count", labels), kSteps);
  EXPECT_EQ(value("headway:step_worker_seconds_count", labels), kSteps);
  // Every step but a request's drop step leaves the instance work, so a gap
  // follows it; a drop step does too when the next request came meanwhile.
  EXPECT_GE(value("headway:step_gap_seconds_count", labels), kRequests * kMaxTokens);
  EXPECT_LT(value("headway:step_gap_seconds_count", labels), kSteps);
  // The workers' own time is part of the step's, which adds the transit.
  EXPECT_GT(value("headway:step_worker_seconds_sum", labels), 0);
  EXPECT_LT(value("headway:step_worker_seconds_sum", labels),
            value("headway:step_seconds_sum", labels));
  // Every prompt token was looked up in the prefix cache once.
  EXPECT_EQ(value("headway:prefix_cache_queries_total", labels), prompt_tokens);
  EXPECT_GE(value("headway:prefix_cache_hits_total", labels), 0);
  EXPECT_EQ(value("headway:num_requests_running", labels), 0);
  EXPECT_EQ(value("headway:num_requests_waiting", labels), 0);
  EXPECT_EQ(value("headway:num_preemptions_total", labels), 0);
}

}  // namespace
}  // namespace headway::testing
