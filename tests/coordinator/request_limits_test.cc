#include "coordinator/http/request_limits.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/coordinator/tiny_vocab.h"

namespace headway {
namespace {

TEST(RequestLimitsTest, JsonDepthCountsArraysAndObjects) {
  EXPECT_FALSE(CheckJsonDepth(R"({"a": [1, {"b": 2}]})", 3));
  std::optional<ApiError> e = CheckJsonDepth(R"({"a": [1, {"b": [2]}]})", 3);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_NE(e->message.find("coordinator.http_max_json_depth"), std::string::npos);
  EXPECT_NE(e->message.find("3 levels"), std::string::npos);
  // Siblings do not add up; closing brackets give the depth back.
  EXPECT_FALSE(CheckJsonDepth("[[1], [2], [[3]]]", 3));
  EXPECT_TRUE(CheckJsonDepth("[[1], [2], [[[3]]]]", 3));
}

TEST(RequestLimitsTest, JsonDepthIgnoresBracketsInStrings) {
  EXPECT_FALSE(CheckJsonDepth(R"({"prompt": "[[[[{{{{"})", 1));
  // An escaped quote does not end the string.
  EXPECT_FALSE(CheckJsonDepth(R"({"prompt": "\" [[[[ \\\" {{{{"})", 1));
  // An escaped backslash does: what follows is outside it.
  EXPECT_TRUE(CheckJsonDepth(R"({"prompt": "\\", "x": [[1]]})", 2));
}

TEST(RequestLimitsTest, DeepDocumentIsRefusedWithoutParsing) {
  const std::string deep(5'000'000, '[');
  EXPECT_TRUE(CheckJsonDepth(deep, 64));
}

TEST(RequestLimitsTest, PromptBytesBoundIsALowerBoundOnTokens) {
  auto tokenizer = Tokenizer::Create(testing::TinyVocab());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const size_t max_token_bytes = MaxTokenBytes(**tokenizer);
  EXPECT_EQ(max_token_bytes, 5u);  // "<|s|>"
  // Texts made of the longest tokens come closest to the bound.
  std::mt19937 rng(7);
  const char* pieces[] = {"abc", "<|s|>", "ab", "x", "\xc3\xa9"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) text += pieces[rng() % 5];
    const size_t n_tokens = (*tokenizer)->Encode(text, /*parse_special=*/true).size();
    EXPECT_GE(n_tokens * max_token_bytes, text.size()) << text;
  }
}

TEST(RequestLimitsTest, PromptBytesRefusedOnlyWhenTheyCannotFit) {
  // max_model_len 10, at most 5 bytes a token: 45 bytes may be 9 tokens.
  EXPECT_FALSE(CheckPromptBytes(45, 5, 10, "prompt"));
  // 46 bytes are at least 10 tokens, which fill max_model_len.
  std::optional<ApiError> e = CheckPromptBytes(46, 5, 10, "prompt");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("maximum context length is 10 tokens"), std::string::npos);
  EXPECT_NE(e->message.find("at least 10 input tokens"), std::string::npos);
  EXPECT_TRUE(CheckPromptBytes(50'000'000, 5, 10, "messages"));
}

}  // namespace
}  // namespace headway
