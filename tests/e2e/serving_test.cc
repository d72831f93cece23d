// End to end: headway-launch starts a coordinator and a worker on the real
// SmolLM2 model; the tests talk OpenAI HTTP to it.
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

// Prompts of different lengths: shorter than a block, an exact multiple of
// the block size (16) is not guaranteed by text, so lengths vary widely.
const std::vector<std::string>& Prompts() { return SmolLm2TestPrompts(); }

json Greedy(const std::string& prompt, int max_tokens) {
  return json{{"model", "smollm2"},
              {"prompt", prompt},
              {"max_tokens", max_tokens},
              {"temperature", 0}};
}

class ServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(SmolLm2Path())) return;
    DeploymentOptions options;
    options.model_path = SmolLm2Path();
    std::string error;
    deployment_ = Deployment::Start(options, &error).release();
    if (!deployment_) start_error_ = error;
  }
  static void TearDownTestSuite() {
    delete deployment_;
    deployment_ = nullptr;
  }
  void SetUp() override {
    HW_REQUIRE_MODEL(SmolLm2Path());
    ASSERT_NE(deployment_, nullptr) << start_error_;
  }

  // Greedy completion text of `prompt`; fails the test on a non-200 answer.
  static std::string Complete(const Deployment& d, const std::string& prompt, int max_tokens) {
    HttpReply r = d.PostJson("/v1/completions", Greedy(prompt, max_tokens));
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) return "<error>";
    return r.json["choices"][0]["text"].get<std::string>();
  }

  static Deployment* deployment_;
  static std::string start_error_;
};

Deployment* ServingTest::deployment_ = nullptr;
std::string ServingTest::start_error_;

TEST_F(ServingTest, AnswersTheCapitalOfFrance) {
  json request = Greedy(Prompts()[0], 32);
  request["stop"] = json::array({"<|im_end|>"});
  HttpReply r = deployment_->PostJson("/v1/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text = r.json["choices"][0]["text"];
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
  EXPECT_GT(r.json["usage"]["prompt_tokens"].get<int>(), 10);
  EXPECT_GE(r.json["usage"]["completion_tokens"].get<int>(), 1);
  EXPECT_EQ(r.json["usage"]["total_tokens"].get<int>(),
            r.json["usage"]["prompt_tokens"].get<int>() +
                r.json["usage"]["completion_tokens"].get<int>());
}

TEST_F(ServingTest, GreedyOutputIsTheSameAloneAndAmongSixteenConcurrentRequests) {
  constexpr int kMaxTokens = 24;
  long free_at_start = deployment_->FreeBlocks();
  std::vector<std::string> alone;
  for (const auto& p : Prompts()) alone.push_back(Complete(*deployment_, p, kMaxTokens));

  std::vector<std::future<std::string>> futures;
  for (int i = 0; i < 16; ++i) {
    const std::string& prompt = Prompts()[i % Prompts().size()];
    futures.push_back(std::async(std::launch::async, [prompt] {
      return Complete(*deployment_, prompt, kMaxTokens);
    }));
  }
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(futures[i].get(), alone[i % Prompts().size()]) << "request " << i;
  }
  EXPECT_EQ(deployment_->FreeBlocks(), free_at_start);
}

TEST_F(ServingTest, GreedyOutputIsTheSameWithPrefillSplitIntoChunks) {
  constexpr int kMaxTokens = 16;
  std::vector<std::string> whole;
  for (const auto& p : Prompts()) whole.push_back(Complete(*deployment_, p, kMaxTokens));

  // 7 tokens a step: every prompt here is prefilled in several chunks, and
  // chunk ends fall inside blocks.
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.max_num_batched_tokens = 7;
  std::string error;
  auto chunked = Deployment::Start(options, &error);
  ASSERT_NE(chunked, nullptr) << error;
  for (size_t i = 0; i < Prompts().size(); ++i) {
    EXPECT_EQ(Complete(*chunked, Prompts()[i], kMaxTokens), whole[i]) << "prompt " << i;
  }
}

void ExpectOpenAiError(const HttpReply& r, int status, const std::string& fragment) {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.json.is_object()) << r.body;
  ASSERT_TRUE(r.json.contains("error")) << r.body;
  const json& e = r.json["error"];
  EXPECT_TRUE(e["message"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("type")) << r.body;
  EXPECT_NE(e["message"].get<std::string>().find(fragment), std::string::npos) << r.body;
}

TEST_F(ServingTest, BadRequestsGetOpenAiErrorsAndLeakNoBlock) {
  long free_at_start = deployment_->FreeBlocks();
  ASSERT_GT(free_at_start, 0);

  ExpectOpenAiError(deployment_->Post("/v1/completions", "{not json"), 400, "");
  ExpectOpenAiError(deployment_->PostJson("/v1/completions",
                                          json{{"prompt", 42}, {"max_tokens", 4}}),
                    400, "prompt");
  ExpectOpenAiError(deployment_->PostJson("/v1/completions",
                                          json{{"prompt", "hi"}, {"max_tokens", "four"}}),
                    400, "max_tokens");
  ExpectOpenAiError(deployment_->PostJson("/v1/completions",
                                          json{{"prompt", "hi"}, {"max_tokens", 0}}),
                    400, "max_tokens");
  ExpectOpenAiError(deployment_->PostJson("/v1/completions",
                                          json{{"prompt", "hi"}, {"temperature", "hot"}}),
                    400, "temperature");

  // 1024 is max_model_len here; " hello" is one token, so this is ~1500.
  std::string long_prompt;
  for (int i = 0; i < 1500; ++i) long_prompt += " hello";
  HttpReply too_long =
      deployment_->PostJson("/v1/completions", json{{"prompt", long_prompt}, {"max_tokens", 1}});
  ExpectOpenAiError(too_long, 400, "1024");
  EXPECT_NE(too_long.body.find("1500"), std::string::npos) << too_long.body;

  EXPECT_EQ(deployment_->FreeBlocks(), free_at_start);
  // Still serving after the bad requests.
  EXPECT_NE(Complete(*deployment_, "Hello", 2), "<error>");
  EXPECT_EQ(deployment_->FreeBlocks(), free_at_start);
}

TEST_F(ServingTest, ListsTheServedModel) {
  HttpReply r = deployment_->Get("/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "list");
  EXPECT_EQ(r.json["data"][0]["id"], "smollm2");
}

}  // namespace
}  // namespace headway::testing
