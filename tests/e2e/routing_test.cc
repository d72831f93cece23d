// End to end: routing across two mixed instances of the real SmolLM2
// model. A conversation's second turn lands on the instance holding its
// first turn under prefix_aware (and its cached_tokens covers the first
// turn), not under least_loaded; the greedy answers are the same whatever
// the routing.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

constexpr int kBlockSize = 16;
constexpr int kMaxTokens = 16;

struct Turn {
  std::string text;
  int prompt_tokens = -1;
  int cached_tokens = -1;
};

Turn Complete(const Deployment& d, const std::string& prompt, int max_tokens = kMaxTokens) {
  HttpReply r = d.PostJson("/v1/completions", GreedyCompletionBody(prompt, max_tokens));
  Turn t;
  t.text = CompletionText(r);
  if (r.status == 200) {
    t.prompt_tokens = r.json["usage"]["prompt_tokens"].get<int>();
    t.cached_tokens =
        r.json["usage"]["prompt_tokens_details"].value("cached_tokens", -1);
  }
  return t;
}

// headway:routed_requests_total of each instance, [instance id].
std::vector<double> Routed(const Deployment& d, int num_instances) {
  std::vector<double> routed(size_t(num_instances), -1);
  HttpReply r = d.Get("/metrics");
  Result<PromExposition> m = ParsePrometheusText(r.body);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return routed;
  for (int i = 0; i < num_instances; ++i) {
    routed[size_t(i)] = m->Value("headway:routed_requests_total",
                                 {{"model_name", "smollm2"}, {"instance", std::to_string(i)}})
                            .value_or(-1);
  }
  return routed;
}

// Waits until /health says instance `id` runs a sequence.
bool WaitRunning(const Deployment& d, int id) {
  for (int i = 0; i < 600; ++i) {
    HttpReply h = d.Get("/health");
    if (h.json.is_object() && h.json["instances"][id].value("num_running", 0) > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct Conversation {
  Turn first, second;
  std::vector<double> routed_after_first, routed_after_second;
};

// Instance 0 is kept busy by a long request while the first turn arrives,
// so every policy puts the first turn on instance 1. The second turn comes
// once both instances are idle again.
Conversation Converse(const std::string& policy) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.block_size = kBlockSize;
  options.num_instances = 2;
  options.num_threads = 1;
  options.routing_policy = policy;
  std::string error;
  auto d = Deployment::Start(options, &error);
  Conversation c;
  EXPECT_NE(d, nullptr) << error;
  if (d == nullptr) return c;

  std::future<Turn> busy = std::async(std::launch::async, [&d] {
    return Complete(*d, "Write a long story about a lighthouse keeper.", 96);
  });
  EXPECT_TRUE(WaitRunning(*d, 0)) << d->Log();
  const std::string turn1 = SmolLm2ChatPrompt(
      "Tell me about the history of the printing press and why it mattered in Europe.");
  c.first = Complete(*d, turn1);
  c.routed_after_first = Routed(*d, 2);
  EXPECT_FALSE(IsErrorText(busy.get().text));

  const std::string turn2 = turn1 + c.first.text +
                            "<|im_end|>\n<|im_start|>user\nAnd who invented it?<|im_end|>\n"
                            "<|im_start|>assistant\n";
  c.second = Complete(*d, turn2);
  c.routed_after_second = Routed(*d, 2);
  return c;
}

class RoutingE2eTest : public ::testing::Test {
 protected:
  void SetUp() override { HW_REQUIRE_MODEL(SmolLm2Path()); }
};

TEST_F(RoutingE2eTest, SecondTurnLandsOnTheInstanceHoldingTheFirst) {
  const Conversation aware = Converse("prefix_aware");
  ASSERT_FALSE(IsErrorText(aware.first.text)) << aware.first.text;
  ASSERT_FALSE(IsErrorText(aware.second.text)) << aware.second.text;
  // The busy request on 0, the first turn on 1, the second turn on 1 too.
  EXPECT_EQ(aware.routed_after_first, (std::vector<double>{1, 1}));
  EXPECT_EQ(aware.routed_after_second, (std::vector<double>{1, 2}));
  // Its cache holds the first turn's prompt in whole blocks (and more: the
  // answer's computed blocks).
  EXPECT_GE(aware.second.cached_tokens, aware.first.prompt_tokens / kBlockSize * kBlockSize);

  const Conversation least = Converse("least_loaded");
  // Both idle at the second turn: least_loaded takes instance 0, which has
  // never seen the conversation.
  EXPECT_EQ(least.routed_after_second, (std::vector<double>{2, 1}));
  EXPECT_EQ(least.second.cached_tokens, 0);

  // Same greedy answers whatever the routing.
  EXPECT_EQ(aware.first.text, least.first.text);
  EXPECT_EQ(aware.second.text, least.second.text);
  EXPECT_EQ(aware.second.prompt_tokens, least.second.prompt_tokens);
}

TEST_F(RoutingE2eTest, RoundRobinAlternatesAndAnswersTheSame) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.num_instances = 2;
  options.num_threads = 1;
  options.routing_policy = "round_robin";
  std::string error;
  auto d = Deployment::Start(options, &error);
  ASSERT_NE(d, nullptr) << error;
  const std::string prompt = SmolLm2ChatPrompt("Name three rivers.");
  const Turn a = Complete(*d, prompt);
  const Turn b = Complete(*d, prompt);
  EXPECT_EQ(Routed(*d, 2), (std::vector<double>{1, 1}));
  EXPECT_FALSE(IsErrorText(a.text)) << a.text;
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(b.cached_tokens, 0);  // the second went to the other instance
}

}  // namespace
}  // namespace headway::testing
