// The echo and prompt-logprob parts of completions responses
// (coordinator/http/openai_response.h), on a hand-written vocabulary.
#include "coordinator/http/openai_response.h"

#include <gtest/gtest.h>

#include "tests/coordinator/tiny_vocab.h"

namespace headway {
namespace {

using nlohmann::json;

std::unique_ptr<Tokenizer> Tiny() {
  auto tokenizer = Tokenizer::Create(testing::TinyVocab());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return std::move(tokenizer).value();
}

GeneratedToken Token(int32_t id, float logprob, std::vector<std::pair<int32_t, float>> top,
                     int rank = 0) {
  return GeneratedToken{id, logprob, std::move(top), rank};
}

// Token 0 has no logprob; the prompt's others and the generated ones follow,
// with offsets over the token texts from 0.
TEST(OpenAiResponseTest, EchoLogprobsStartWithTheNullFirstToken) {
  std::unique_ptr<Tokenizer> t = Tiny();
  const json j = EchoLogprobsJson(256, {Token(257, -1.5f, {{258, -0.5f}})},
                                  {Token('x', -0.25f, {})}, *t);
  EXPECT_EQ(j["tokens"], json({"ab", "bc", "x"}));
  EXPECT_EQ(j["token_logprobs"], json({nullptr, -1.5, -0.25}));
  EXPECT_EQ(j["top_logprobs"][0], json(nullptr));
  EXPECT_EQ(j["top_logprobs"][1], json({{"abc", -0.5}, {"bc", -1.5}}));  // and the token itself
  EXPECT_EQ(j["top_logprobs"][2], json({{"x", -0.25}}));
  EXPECT_EQ(j["text_offset"], json({0, 2, 4}));
}

// text_offset counts characters, as OpenAI's: "é" (2 bytes) and "🙂" (4)
// advance it by one; a token holding a character's last bytes adds none.
TEST(OpenAiResponseTest, TextOffsetsCountCharacters) {
  std::unique_ptr<Tokenizer> t = Tiny();
  EXPECT_EQ(TextLength("caf\xc3\xa9"), 4u);
  EXPECT_EQ(TextLength("\xf0\x9f\x99\x82!"), 2u);
  EXPECT_EQ(TextLength("\x99\x82"), 0u);
  // Byte tokens 0xC3 0xA9 ("é" split in two), then "a".
  const json j = CompletionLogprobsJson(
      {Token(0xC3, -1.0f, {}), Token(0xA9, -1.0f, {}), Token('a', -1.0f, {})}, *t, 3);
  EXPECT_EQ(j["text_offset"], json({3, 4, 4}));
}

// vLLM's shape: null, then per token a map from token id to logprob, rank
// and text, holding the prompt token and at most num_top alternatives.
TEST(OpenAiResponseTest, PromptLogprobsHoldThePromptTokenAndItsAlternatives) {
  std::unique_ptr<Tokenizer> t = Tiny();
  const std::vector<GeneratedToken> prompt = {
      Token(257, -2.0f, {{258, -0.5f}, {'a', -1.0f}, {257, -2.0f}}, 3),
      Token(258, -0.5f, {{258, -0.5f}, {'a', -1.0f}}, 1)};
  const json j = PromptLogprobsJson(prompt, 2, *t);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0], json(nullptr));
  EXPECT_EQ(j[1].size(), 3u);
  EXPECT_EQ(j[1]["257"], json({{"logprob", -2.0}, {"rank", 3}, {"decoded_token", "bc"}}));
  EXPECT_EQ(j[1]["258"]["rank"], 1);
  EXPECT_EQ(j[1]["97"]["rank"], 2);
  EXPECT_EQ(j[2].size(), 2u);  // the prompt token is also the best
  EXPECT_EQ(PromptLogprobsJson(prompt, 0, *t)[1].size(), 1u);
}

// Every choice of a prompt echoes it and repeats its first choice's prompt
// logprobs.
TEST(OpenAiResponseTest, EveryChoiceEchoesItsPrompt) {
  std::unique_ptr<Tokenizer> t = Tiny();
  CompletionOutcome first, second;
  first.text = "x";
  first.prompt_logprobs = {Token(257, -1.0f, {}, 4)};
  second.text = "y";
  PromptEcho echo{true, {"abbc"}, {256}, 0};
  const json j = CompletionResponseJson({"cmpl-1", 0, "m"}, {first, second}, 2, *t,
                                        /*logprobs=*/true, &echo);
  for (int c = 0; c < 2; ++c) {
    const json& choice = j["choices"][c];
    EXPECT_EQ(choice["text"], c == 0 ? "abbcx" : "abbcy");
    EXPECT_EQ(choice["logprobs"]["token_logprobs"][1], -1.0);
    EXPECT_EQ(choice["prompt_logprobs"][1]["257"]["rank"], 4);
  }
  const json plain = CompletionResponseJson({"cmpl-1", 0, "m"}, {first}, 1, *t, false);
  EXPECT_EQ(plain["choices"][0]["text"], "x");
  EXPECT_FALSE(plain["choices"][0].contains("prompt_logprobs"));
}

// Chat has one prompt: vLLM puts its prompt logprobs at the top level.
TEST(OpenAiResponseTest, ChatPromptLogprobsAreTopLevel) {
  std::unique_ptr<Tokenizer> t = Tiny();
  CompletionOutcome o;
  o.text = "x";
  o.prompt_logprobs = {Token(257, -1.0f, {{258, -0.5f}}, 2)};
  const json j = ChatResponseJson({"chatcmpl-1", 0, "m"}, {o}, *t, false, 1);
  ASSERT_TRUE(j.contains("prompt_logprobs"));
  EXPECT_EQ(j["prompt_logprobs"].size(), 2u);
  EXPECT_EQ(j["prompt_logprobs"][1]["258"]["rank"], 1);
  EXPECT_FALSE(ChatResponseJson({"chatcmpl-1", 0, "m"}, {o}, *t, false).contains("prompt_logprobs"));
}

// vLLM's chat echo: the content starts with the echoed message.
TEST(OpenAiResponseTest, ChatEchoStartsTheContent) {
  std::unique_ptr<Tokenizer> t = Tiny();
  CompletionOutcome o;
  o.text = " world";
  const json j = ChatResponseJson({"chatcmpl-1", 0, "m"}, {o, o}, *t, false, -1, "Hello");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(j["choices"][1]["message"]["content"], "Hello world");
}

}  // namespace
}  // namespace headway
