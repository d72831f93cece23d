// End to end: the prefix cache on the real SmolLM2 model. A prompt that
// starts with cached blocks skips their prefill and must still produce the
// same greedy tokens as on a deployment that has never seen it.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

constexpr int kBlockSize = 16;
constexpr int kMaxTokens = 24;

struct Answer {
  std::string text;
  int cached_tokens = -1;    // usage.prompt_tokens_details.cached_tokens; -1 = absent
};

Answer CompleteIds(const Deployment& d, const std::vector<int32_t>& prompt) {
  json request = {{"model", "smollm2"},
                  {"prompt", prompt},
                  {"max_tokens", kMaxTokens},
                  {"temperature", 0},
                  {"ignore_eos", true}};
  HttpReply r = d.PostJson("/v1/completions", request);
  Answer a;
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return a;
  a.text = r.json["choices"][0]["text"].get<std::string>();
  const json& usage = r.json["usage"];
  if (usage.contains("prompt_tokens_details") && usage["prompt_tokens_details"].is_object()) {
    a.cached_tokens = usage["prompt_tokens_details"].value("cached_tokens", -1);
  }
  EXPECT_EQ(usage["completion_tokens"].get<int>(), kMaxTokens);
  return a;
}

std::vector<int32_t> Tokenize(const Deployment& d, const std::string& text) {
  HttpReply r = d.PostJson(
      "/tokenize", {{"model", "smollm2"}, {"prompt", text}, {"add_special_tokens", false}});
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return {};
  return r.json["tokens"].get<std::vector<int32_t>>();
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class PrefixCacheE2eTest : public ::testing::Test {
 protected:
  void SetUp() override { HW_REQUIRE_MODEL(SmolLm2Path()); }

  static std::unique_ptr<Deployment> Start() {
    DeploymentOptions options;
    options.model_path = SmolLm2Path();
    options.block_size = kBlockSize;
    std::string error;
    auto d = Deployment::Start(options, &error);
    EXPECT_NE(d, nullptr) << error;
    return d;
  }
};

TEST_F(PrefixCacheE2eTest, GreedyOutputWithAPrefixHitEqualsOutputWithout) {
  auto warm = Start();
  ASSERT_NE(warm, nullptr);
  const long free_at_start = warm->FreeBlocks();
  std::vector<int32_t> story = Tokenize(
      *warm,
      "Once upon a time, in a small village at the edge of a great forest, there lived an old "
      "woodcutter and his three daughters. Every morning he walked into the forest with his "
      "axe, and every evening he came home with wood for the fire and stories for the girls.");
  ASSERT_GE(story.size(), 3u * kBlockSize);
  // A: exactly three blocks. B: A's three blocks and a different ending.
  std::vector<int32_t> a(story.begin(), story.begin() + 3 * kBlockSize);
  std::vector<int32_t> b = Concat(a, Tokenize(*warm, " One day the youngest daughter said"));
  ASSERT_GT(b.size(), a.size());

  Answer a_cold = CompleteIds(*warm, a);
  Answer a_hit = CompleteIds(*warm, a);
  Answer b_hit = CompleteIds(*warm, b);
  // A hit leaves at least one prompt token to compute, in whole blocks: A's
  // last block is computed again; B shares all three.
  if (a_cold.cached_tokens >= 0) {
    EXPECT_EQ(a_cold.cached_tokens, 0);
    EXPECT_EQ(a_hit.cached_tokens, 2 * kBlockSize);
    EXPECT_EQ(b_hit.cached_tokens, 3 * kBlockSize);
  }
  EXPECT_EQ(a_hit.text, a_cold.text);
  // Cached blocks are evictable, so they count as free: nothing is held.
  EXPECT_EQ(warm->FreeBlocks(), free_at_start);

  // B on a deployment that has never seen A.
  auto cold = Start();
  ASSERT_NE(cold, nullptr);
  Answer b_cold = CompleteIds(*cold, b);
  if (b_cold.cached_tokens >= 0) {
    EXPECT_EQ(b_cold.cached_tokens, 0);
  }
  EXPECT_EQ(b_hit.text, b_cold.text);
  EXPECT_FALSE(b_cold.text.empty());
}

TEST_F(PrefixCacheE2eTest, ConcurrentRequestsSharingAPrefixAgreeWithTheirColdAnswers) {
  auto d = Start();
  ASSERT_NE(d, nullptr);
  std::vector<int32_t> system = Tokenize(
      *d,
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face. Answer briefly and precisely.<|im_end|>\n<|im_start|>user\n");
  const std::vector<std::string> questions = {
      "What is the capital of France?", "Name a colour.", "What is two plus two?",
      "Write one word about the sea."};
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& q : questions) {
    prompts.push_back(Concat(system, Tokenize(*d, q + "<|im_end|>\n<|im_start|>assistant\n")));
  }
  // Cold, one at a time: the first computes the shared prefix, later ones
  // hit it (compared below with a run where all of them hit).
  std::vector<Answer> first;
  for (const auto& p : prompts) first.push_back(CompleteIds(*d, p));
  std::vector<std::future<Answer>> again;
  for (const auto& p : prompts) {
    again.push_back(std::async(std::launch::async, [&d, p] { return CompleteIds(*d, p); }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    Answer a = again[i].get();
    EXPECT_EQ(a.text, first[i].text) << "prompt " << i;
    if (a.cached_tokens >= 0) {
      EXPECT_GT(a.cached_tokens, 0) << "prompt " << i;
      EXPECT_EQ(a.cached_tokens % kBlockSize, 0);
    }
  }
}

}  // namespace
}  // namespace headway::testing
