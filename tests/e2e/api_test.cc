// End to end through the OpenAI API on the real SmolLM2 model: chat
// completions through the GGUF chat template, streaming (SSE) against the
// non-streamed greedy answer, stop strings and usage counts.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "coordinator/http/sse.h"
#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/sampling_checks.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

constexpr int kMaxTokens = 24;

class ApiTest : public ::testing::Test {
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

  static json Messages(const std::string& question) {
    return json::array({{{"role", "user"}, {"content", question}}});
  }

  // The events of a streamed request ("[DONE]" as a JSON string); fails the
  // test unless the body is well-formed SSE ending with [DONE].
  static std::vector<json> Stream(const std::string& path, const json& body) {
    HttpReply r = deployment_->PostJson(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    auto events = ParseSse(r.body);
    EXPECT_TRUE(events.ok()) << events.status().ToString() << "\n" << r.body;
    std::vector<json> out;
    if (!events.ok()) return out;
    for (const std::string& e : *events) {
      if (e == "[DONE]") {
        out.push_back("[DONE]");
        continue;
      }
      json j = json::parse(e, nullptr, false);
      EXPECT_TRUE(j.is_object()) << e;
      out.push_back(j);
    }
    EXPECT_FALSE(out.empty());
    if (!out.empty()) {
      EXPECT_EQ(out.back(), "[DONE]");
    }
    for (size_t i = 0; i + 1 < out.size(); ++i) EXPECT_NE(out[i], "[DONE]") << "[DONE] before the end";
    return out;
  }

  static std::string Text(const std::vector<json>& events) {
    std::string text;
    for (const json& e : events) {
      if (!e.is_object() || e["choices"].empty()) continue;
      const json& c = e["choices"][0];
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    }
    return text;
  }

  static Deployment* deployment_;
  static std::string start_error_;
};

Deployment* ApiTest::deployment_ = nullptr;
std::string ApiTest::start_error_;

TEST_F(ApiTest, StreamedChatEqualsNonStreamedGreedyAnswer) {
  json messages = Messages("What is the capital of France?");
  json body = {{"model", "smollm2"}, {"messages", messages}, {"max_tokens", kMaxTokens}, {"temperature", 0}};
  HttpReply whole = deployment_->PostJson("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json& choice = whole.json["choices"][0];
  EXPECT_EQ(whole.json["object"], "chat.completion");
  EXPECT_EQ(choice["message"]["role"], "assistant");
  std::string answer = choice["message"]["content"];
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;

  // Usage: the prompt is the chat template's rendering.
  HttpReply tok = deployment_->PostJson("/tokenize", {{"messages", messages}});
  ASSERT_EQ(tok.status, 200) << tok.body;
  const json& usage = whole.json["usage"];
  EXPECT_EQ(usage["prompt_tokens"], tok.json["count"]);
  int completion_tokens = usage["completion_tokens"];
  EXPECT_GE(completion_tokens, 1);
  EXPECT_LE(completion_tokens, kMaxTokens);
  EXPECT_EQ(usage["total_tokens"], tok.json["count"].get<int>() + completion_tokens);
  if (choice["finish_reason"] == "length") {
    EXPECT_EQ(completion_tokens, kMaxTokens);
  }

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::vector<json> events = Stream("/v1/chat/completions", body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(Text(events), answer);
  const json& finish = events[events.size() - 3];
  EXPECT_EQ(finish["choices"][0]["finish_reason"], choice["finish_reason"]);
  const json& usage_chunk = events[events.size() - 2];
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], usage["prompt_tokens"]);
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], usage["completion_tokens"]);
  // The same prompt a second time: its full blocks come from the prefix cache.
  EXPECT_GE(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 16);
  EXPECT_LT(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            usage["prompt_tokens"].get<int>());
  for (const json& e : events) {
    if (e.is_object()) {
      EXPECT_EQ(e["object"], "chat.completion.chunk");
    }
  }
}

TEST_F(ApiTest, StopStringsCutTheTextExactly) {
  const std::string prompt = "The first five days of the week are Monday,";
  json body = {{"prompt", prompt}, {"max_tokens", kMaxTokens}, {"temperature", 0}};
  HttpReply free_run = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(free_run.status, 200) << free_run.body;
  std::string text = free_run.json["choices"][0]["text"];
  ASSERT_GE(text.size(), 12u) << text;
  // A stop string from the middle of the greedy answer: the answer is cut
  // right before its first occurrence.
  std::string stop = text.substr(text.size() / 2, 3);
  std::string expected = text.substr(0, text.find(stop));
  body["stop"] = json::array({stop, "never-appears-xyz"});
  HttpReply cut = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(cut.status, 200) << cut.body;
  EXPECT_EQ(cut.json["choices"][0]["text"], expected) << "stop " << json(stop).dump();
  EXPECT_EQ(cut.json["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(cut.json["choices"][0]["stop_reason"], stop);
  EXPECT_LT(cut.json["usage"]["completion_tokens"].get<int>(), kMaxTokens);

  // Streamed: the same text, nothing of the stop string ever sent.
  body["stream"] = true;
  std::vector<json> events = Stream("/v1/completions", body);
  EXPECT_EQ(Text(events), expected);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "stop");
}

TEST_F(ApiTest, CompletionUsageAndLogprobs) {
  json body = {{"prompt", "1, 2, 3, 4,"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true},
               {"logprobs", 2}};
  HttpReply r = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  HttpReply tok = deployment_->PostJson("/tokenize", {{"prompt", "1, 2, 3, 4,"}});
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], tok.json["count"]);
  EXPECT_EQ(r.json["usage"]["completion_tokens"], 8);
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], "length");
  const json& lp = r.json["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 8u);
  std::string joined;
  for (const json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, r.json["choices"][0]["text"]);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
    // Greedy: the sampled token is the most likely one.
    double best = -1e9;
    for (auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-4);
  }
  HttpReply d = deployment_->PostJson("/detokenize", {{"tokens", tok.json["tokens"]}});
  EXPECT_EQ(d.json["prompt"], "1, 2, 3, 4,");
}

// Greedy under frequency and presence penalties follows their formula on
// the returned raw logprobs; ", " repeats in the plain answer, so the
// penalties must change it.
TEST_F(ApiTest, PenaltiesFollowTheirFormulaOnTheReturnedLogprobs) {
  ExpectGreedyFollowsPenalties(*deployment_, "1, 2, 3, 4,", 0.8, 0.6, /*plain_repeats=*/true);
}

TEST_F(ApiTest, MinTokensHoldsBackEosAndLogitBiasSteers) {
  // A chat answer that ends on its own, and the same with min_tokens past
  // its end: EOS cannot be sampled before then.
  json body = {{"messages", Messages("Say just the word yes.")}, {"max_tokens", 40},
               {"temperature", 0}};
  HttpReply plain = deployment_->PostJson("/v1/chat/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  ASSERT_EQ(plain.json["choices"][0]["finish_reason"], "stop") << plain.body;
  const int n = plain.json["usage"]["completion_tokens"];
  body["min_tokens"] = n + 5;
  HttpReply held = deployment_->PostJson("/v1/chat/completions", body);
  ASSERT_EQ(held.status, 200) << held.body;
  EXPECT_GE(held.json["usage"]["completion_tokens"].get<int>(), n + 5) << held.body;

  // A bias of +100 on one token makes greedy pick it every time.
  HttpReply tok =
      deployment_->PostJson("/tokenize", {{"prompt", " banana"}, {"add_special_tokens", false}});
  ASSERT_EQ(tok.status, 200);
  const int id = tok.json["tokens"][0];
  json biased = {{"prompt", "1, 2, 3"}, {"max_tokens", 4}, {"temperature", 0},
                 {"logit_bias", {{std::to_string(id), 100}}}};
  HttpReply b = deployment_->PostJson("/v1/completions", biased);
  ASSERT_EQ(b.status, 200) << b.body;
  HttpReply expected = deployment_->PostJson(
      "/detokenize", {{"tokens", json::array({id, id, id, id})}});
  EXPECT_EQ(b.json["choices"][0]["text"], expected.json["prompt"]);
}

TEST_F(ApiTest, AllowedTokensAndBadWords) {
  auto first_id = [&](const std::string& text) {
    return deployment_->PostJson("/tokenize", {{"prompt", text}, {"add_special_tokens", false}})
        .json["tokens"][0]
        .get<int>();
  };
  const int yes = first_id(" yes"), no = first_id(" no");
  HttpReply r = deployment_->PostJson(
      "/v1/completions", {{"prompt", "Is the sky blue?"}, {"max_tokens", 6}, {"temperature", 1.0},
                          {"seed", 3}, {"allowed_token_ids", {yes, no}}, {"logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  for (const json& t : r.json["choices"][0]["logprobs"]["tokens"]) {
    EXPECT_TRUE(t == " yes" || t == " no") << t;
  }

  // Counting on: " 5" comes next unless "5" is a bad word.
  json body = {{"prompt", "1, 2, 3, 4,"}, {"max_tokens", 3}, {"temperature", 0}};
  HttpReply plain = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(plain.status, 200);
  ASSERT_EQ(plain.json["choices"][0]["text"].get<std::string>().rfind(" 5", 0), 0u) << plain.body;
  body["bad_words"] = {"5"};
  HttpReply banned = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(banned.status, 200) << banned.body;
  EXPECT_NE(banned.json["choices"][0]["text"].get<std::string>().rfind(" 5", 0), 0u)
      << banned.body;

  // Nothing left to sample: 400, not a forbidden token.
  const int eos = first_id("<|im_end|>");
  HttpReply none = deployment_->PostJson(
      "/v1/completions", {{"prompt", "a"}, {"allowed_token_ids", {eos}}, {"min_tokens", 1}});
  EXPECT_EQ(none.status, 400) << none.body;
  EXPECT_EQ(none.json["error"]["param"], "allowed_token_ids");
  none = deployment_->PostJson(
      "/v1/completions", {{"prompt", "a"}, {"allowed_token_ids", {yes}}, {"bad_words", {"yes"}}});
  EXPECT_EQ(none.status, 400) << none.body;
}

// n seeded choices: reproducible, each its own sample, the prompt counted
// once in the usage and prefilled once (the other choices hit its blocks).
TEST_F(ApiTest, NChoicesShareThePrefillAndRepeatWithASeed) {
  std::string prompt = "Here is a long list of fruits, one per line:";
  for (int i = 0; i < 12; ++i) prompt += " apple, pear, plum, cherry, melon,";
  json body = {{"prompt", prompt}, {"max_tokens", 8},     {"temperature", 1.0},
               {"seed", 7},        {"n", 4},              {"ignore_eos", true}};
  const double hits_before =
      SumOfSamples(deployment_->Get("/metrics").body, "headway:prefix_cache_hits_total");
  HttpReply r = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const double hits_after =
      SumOfSamples(deployment_->Get("/metrics").body, "headway:prefix_cache_hits_total");
  HttpReply tok = deployment_->PostJson("/tokenize", {{"prompt", prompt}});
  const int prompt_tokens = tok.json["count"];
  ASSERT_EQ(r.json["choices"].size(), 4u);
  std::set<std::string> texts;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.json["choices"][i]["index"], i);
    texts.insert(r.json["choices"][i]["text"].get<std::string>());
  }
  EXPECT_GT(texts.size(), 1u) << r.body;  // sampled apart
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r.json["usage"]["completion_tokens"], 32);
  // Choices 1..3 found the first one's whole blocks (block size 16), all
  // but the one holding the last prompt token, which each must compute.
  EXPECT_GE(hits_after - hits_before, 3.0 * ((prompt_tokens - 1) / 16 * 16)) << r.body;

  HttpReply again = deployment_->PostJson("/v1/completions", body);
  ASSERT_EQ(again.status, 200);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(again.json["choices"][i]["text"], r.json["choices"][i]["text"]) << "choice " << i;
  }
  // Streamed, each chunk names its choice; the texts are the same.
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::vector<std::string> streamed(4);
  json usage;
  for (const json& e : Stream("/v1/completions", body)) {
    if (!e.is_object()) continue;
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    for (const json& c : e["choices"]) streamed.at(c["index"].get<size_t>()) += c["text"];
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(streamed[i], r.json["choices"][i]["text"]) << i;
  EXPECT_EQ(usage["completion_tokens"], 32);
  EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
}

TEST_F(ApiTest, APromptListGetsItsChoicesInOrder) {
  const std::vector<std::string> prompts = {"1, 2, 3, 4,", "Monday, Tuesday,"};
  std::vector<std::string> alone;
  for (const std::string& p : prompts) {
    HttpReply r = deployment_->PostJson(
        "/v1/completions", {{"prompt", p}, {"max_tokens", 6}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    alone.push_back(r.json["choices"][0]["text"]);
  }
  HttpReply r = deployment_->PostJson(
      "/v1/completions",
      {{"prompt", prompts}, {"n", 2}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.json["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.json["choices"][i]["index"], i);
    EXPECT_EQ(r.json["choices"][i]["text"], alone[size_t(i / 2)]) << "choice " << i;
  }
  int prompt_tokens = 0;
  for (const std::string& p : prompts) {
    prompt_tokens += deployment_->PostJson("/tokenize", {{"prompt", p}}).json["count"].get<int>();
  }
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r.json["usage"]["completion_tokens"], 24);

  // Chat with n: every choice answers the one conversation.
  HttpReply chat = deployment_->PostJson(
      "/v1/chat/completions",
      {{"messages", Messages("Name a color.")}, {"n", 3}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  ASSERT_EQ(chat.json["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(chat.json["choices"][i]["index"], i);
    EXPECT_EQ(chat.json["choices"][i]["message"], chat.json["choices"][0]["message"]);
  }
}

TEST_F(ApiTest, FieldsHeadwayDoesNotActOnAre400) {
  HttpReply r = deployment_->PostJson(
      "/v1/chat/completions",
      {{"messages", Messages("Give me JSON.")}, {"guided_grammar", "root ::= \"a\""}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json["error"]["param"], "guided_grammar");
  // A schema keyword outside the subset is named, as is the field.
  r = deployment_->PostJson(
      "/v1/chat/completions",
      {{"messages", Messages("Give me JSON.")},
       {"response_format",
        {{"type", "json_schema"},
         {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"minProperties", 1}}}}}}}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json["error"]["param"], "response_format");
  EXPECT_NE(r.json["error"]["message"].get<std::string>().find("minProperties"), std::string::npos)
      << r.body;
  r = deployment_->PostJson("/v1/completions", {{"prompt", "a"}, {"temprature", 0.5}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json["error"]["message"], "Unrecognized request argument supplied: temprature");
}

}  // namespace
}  // namespace headway::testing
