#include "coordinator/http/completion_request.h"

#include <gtest/gtest.h>

namespace headway {
namespace {

const CompletionLimits kLimits{"smollm2", 1000, 64};

CompletionRequest Ok(const std::string& body) {
  ParsedCompletion p = ParseCompletionRequest(body, kLimits);
  if (auto* e = std::get_if<ApiError>(&p)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<CompletionRequest>(p);
}

ApiError Err(const std::string& body) {
  ParsedCompletion p = ParseCompletionRequest(body, kLimits);
  if (auto* e = std::get_if<ApiError>(&p)) return *e;
  ADD_FAILURE() << body << " was accepted";
  return {};
}

void ExpectBadRequest(const std::string& body, const std::string& param,
                      const std::string& fragment) {
  ApiError e = Err(body);
  EXPECT_EQ(e.http_status, 400) << body;
  EXPECT_EQ(e.type, "invalid_request_error") << body;
  EXPECT_EQ(e.param, param) << body;
  EXPECT_NE(e.message.find(fragment), std::string::npos) << body << " -> " << e.message;
}

TEST(CompletionRequestTest, Defaults) {
  CompletionRequest r = Ok(R"({"model": "smollm2", "prompt": "Hello"})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_FALSE(r.prompts[0].is_ids);
  EXPECT_EQ(r.params.n, 1);
  EXPECT_FALSE(r.params.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 1.0f);
  EXPECT_EQ(r.params.sampling.top_k, -1);
  EXPECT_FALSE(r.params.sampling.seed.has_value());
  EXPECT_TRUE(r.params.stop.empty());
  // The model may be left out.
  Ok(R"({"prompt": "Hello"})");
}

TEST(CompletionRequestTest, AllFields) {
  CompletionRequest r = Ok(
      R"({"model": "smollm2", "prompt": [1, 2, 999], "max_tokens": 5, "temperature": 0,
          "top_p": 0.5, "top_k": 3, "seed": 42, "stop": ["\n", "x"], "n": 1, "stream": false,
          "echo": false, "logprobs": null, "ignore_eos": true, "user": "ignored"})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_ids);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 999}));
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 0.5f);
  EXPECT_EQ(r.params.sampling.top_k, 3);
  EXPECT_EQ(r.params.sampling.seed, 42u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"\n", "x"}));
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(Ok(R"({"prompt": "a", "stop": "END"})").params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(Ok(R"({"prompt": ["one prompt"]})").prompts[0].text, "one prompt");
  EXPECT_EQ(Ok(R"({"prompt": [[4, 5]]})").prompts[0].ids, (std::vector<int32_t>{4, 5}));
}

TEST(CompletionRequestTest, MalformedJson) {
  ExpectBadRequest("{not json", "", "not valid JSON");
  ExpectBadRequest("[1, 2]", "", "JSON object");
  ExpectBadRequest("", "", "not valid JSON");
}

TEST(CompletionRequestTest, WrongTypesNameTheField) {
  ExpectBadRequest(R"({"prompt": "a", "max_tokens": "5"})", "max_tokens", "max_tokens");
  ExpectBadRequest(R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens", "integer");
  ExpectBadRequest(R"({"prompt": "a", "temperature": "hot"})", "temperature", "number");
  ExpectBadRequest(R"({"prompt": "a", "top_p": true})", "top_p", "number");
  ExpectBadRequest(R"({"prompt": "a", "top_k": 1.5})", "top_k", "integer");
  ExpectBadRequest(R"({"prompt": "a", "seed": "x"})", "seed", "integer");
  ExpectBadRequest(R"({"prompt": "a", "stop": 3})", "stop", "string");
  ExpectBadRequest(R"({"prompt": "a", "stop": ["x", 1]})", "stop", "string");
  ExpectBadRequest(R"({"prompt": 12})", "prompt", "prompt");
  ExpectBadRequest(R"({"prompt": [1, "a"]})", "prompt", "prompt");
  ExpectBadRequest(R"({"prompt": "a", "model": 3})", "model", "string");
  ExpectBadRequest(R"({"prompt": "a", "stream": "yes"})", "stream", "boolean");
}

TEST(CompletionRequestTest, Ranges) {
  ExpectBadRequest(R"({"prompt": "a", "max_tokens": 0})", "max_tokens", "at least 1");
  ExpectBadRequest(R"({"prompt": "a", "max_tokens": -3})", "max_tokens", "at least 1");
  ExpectBadRequest(R"({"prompt": "a", "temperature": -0.1})", "temperature", "non-negative");
  ExpectBadRequest(R"({"prompt": "a", "top_p": 0})", "top_p", "(0, 1]");
  ExpectBadRequest(R"({"prompt": "a", "top_p": 1.5})", "top_p", "(0, 1]");
  ExpectBadRequest(R"({"prompt": "a", "top_k": -2})", "top_k", "top_k");
  ExpectBadRequest(R"({"prompt": [1, 1000]})", "prompt", "outside the vocabulary");
  ExpectBadRequest(R"({"prompt": [-1]})", "prompt", "outside the vocabulary");
}

TEST(CompletionRequestTest, EmptyOrMissingPrompt) {
  ExpectBadRequest(R"({"model": "smollm2"})", "prompt", "required");
  ExpectBadRequest(R"({"prompt": ""})", "prompt", "empty");
  ExpectBadRequest(R"({"prompt": []})", "prompt", "empty");
  ExpectBadRequest(R"({"prompt": null})", "prompt", "required");
}

TEST(CompletionRequestTest, PromptListsAndN) {
  CompletionRequest r = Ok(R"({"prompt": ["a", [4, 5], "c"], "n": 3})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[0].text, "a");
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.prompts[2].text, "c");
  EXPECT_EQ(r.params.n, 3);
  ExpectBadRequest(R"({"prompt": ["a", ""]})", "prompt", "'prompt[1]' must not be empty");
  ExpectBadRequest(R"({"prompt": ["a", [1, 1000]]})", "prompt", "outside the vocabulary");
  ExpectBadRequest(R"({"prompt": ["a", 3]})", "prompt", "prompt");
  ExpectBadRequest(R"({"prompt": "a", "n": 0})", "n", "n must be in [1, 128], got 0.");
  ExpectBadRequest(R"({"prompt": "a", "n": 129})", "n", "[1, 128]");
  ExpectBadRequest(R"({"prompt": ["a", "b", "c"], "n": 50})", "n", "50 x 3");
}

TEST(CompletionRequestTest, UnsupportedOptions) {
  ExpectBadRequest(R"({"prompt": "a", "best_of": 3})", "best_of", "not supported");
  EXPECT_TRUE(Ok(R"({"prompt": "a", "echo": true, "stream": true})").echo);
  EXPECT_EQ(Ok(R"({"prompt": "a", "prompt_logprobs": 0, "stream": true})")
                .params.sampling.prompt_logprobs,
            0);
}

// echo's logprobs cover the prompt: they ask for prompt logprobs with the
// logprobs field's alternatives; vLLM's prompt_logprobs asks on its own.
TEST(CompletionRequestTest, EchoAndPromptLogprobs) {
  CompletionRequest r = Ok(R"({"prompt": "a"})");
  EXPECT_FALSE(r.echo);
  EXPECT_EQ(r.params.prompt_logprobs, -1);
  EXPECT_EQ(r.params.sampling.prompt_logprobs, -1);
  r = Ok(R"({"prompt": "a", "echo": true})");
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.params.sampling.prompt_logprobs, -1);  // the text alone needs no logits
  r = Ok(R"({"prompt": "a", "echo": true, "logprobs": 3})");
  EXPECT_EQ(r.params.sampling.prompt_logprobs, 3);
  r = Ok(R"({"prompt": "a", "prompt_logprobs": 0})");
  EXPECT_FALSE(r.echo);
  EXPECT_EQ(r.params.prompt_logprobs, 0);
  EXPECT_EQ(r.params.sampling.prompt_logprobs, 0);
  r = Ok(R"({"prompt": "a", "echo": true, "logprobs": 2, "prompt_logprobs": 5})");
  EXPECT_EQ(r.params.sampling.prompt_logprobs, 5);
  ExpectBadRequest(R"({"prompt": "a", "prompt_logprobs": 21})", "prompt_logprobs", "[0, 20]");
  ExpectBadRequest(R"({"prompt": "a", "prompt_logprobs": -1})", "prompt_logprobs", "[0, 20]");
  ExpectBadRequest(R"({"prompt": "a", "echo": 1})", "echo", "boolean");
  // max_tokens 0: the prompt alone, with echo only (vLLM's scoring form).
  EXPECT_EQ(Ok(R"({"prompt": "a", "echo": true, "max_tokens": 0})").params.max_tokens, 0);
  ExpectBadRequest(R"({"prompt": "a", "max_tokens": 0})", "max_tokens",
                   "max_tokens must be at least 1, got 0.");
  ExpectBadRequest(R"({"prompt": "a", "echo": true, "max_tokens": 0, "stream": true})",
                   "max_tokens", "max_tokens: 0 with stream: true is not supported yet");
  ExpectBadRequest(R"({"prompt": "a", "max_tokens": -1})", "max_tokens", "at least 1");
}

TEST(CompletionRequestTest, LogitProcessors) {
  CompletionRequest r = Ok(R"({"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -2,
                               "repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 3,
                               "logit_bias": {"7": 5, "999": -100}})");
  EXPECT_FLOAT_EQ(r.params.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.frequency_penalty, -2.0f);
  EXPECT_FLOAT_EQ(r.params.sampling.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(r.params.sampling.min_p, 0.05f);
  EXPECT_EQ(r.params.min_tokens, 3);
  EXPECT_EQ(r.params.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{7, 5.0f}, {999, -100.0f}}));
  EXPECT_TRUE(r.params.sampling.Penalizes());
  EXPECT_FALSE(Ok(R"({"prompt": "a", "logit_bias": {}})").params.sampling.Penalizes());

  ExpectBadRequest(R"({"prompt": "a", "presence_penalty": 2.5})", "presence_penalty",
                   "must be in [-2, 2], got 2.5");
  ExpectBadRequest(R"({"prompt": "a", "frequency_penalty": -3})", "frequency_penalty", "[-2, 2]");
  ExpectBadRequest(R"({"prompt": "a", "repetition_penalty": 0})", "repetition_penalty",
                   "greater than zero");
  ExpectBadRequest(R"({"prompt": "a", "min_p": 1.5})", "min_p", "[0, 1]");
  ExpectBadRequest(R"({"prompt": "a", "min_tokens": -1})", "min_tokens", "min_tokens");
  ExpectBadRequest(R"({"prompt": "a", "logit_bias": [1]})", "logit_bias", "object");
  ExpectBadRequest(R"({"prompt": "a", "logit_bias": {"1000": 1}})", "logit_bias",
                   "not a token id in [0, 1000)");
  ExpectBadRequest(R"({"prompt": "a", "logit_bias": {"x": 1}})", "logit_bias", "token id");
  ExpectBadRequest(R"({"prompt": "a", "logit_bias": {"-1": 1}})", "logit_bias", "token id");
  ExpectBadRequest(R"({"prompt": "a", "logit_bias": {"5": 101}})", "logit_bias", "[-100, 100]");
  ExpectBadRequest(R"({"prompt": "a", "logit_bias": {"5": "up"}})", "logit_bias", "[-100, 100]");

  r = Ok(R"({"prompt": "a", "allowed_token_ids": [3, 9], "bad_words": ["no", " never mind"]})");
  EXPECT_EQ(r.params.sampling.allowed_token_ids, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(r.params.bad_words, (std::vector<std::string>{"no", " never mind"}));
  ExpectBadRequest(R"({"prompt": "a", "allowed_token_ids": []})", "allowed_token_ids",
                   "not allowed to be empty");
  ExpectBadRequest(R"({"prompt": "a", "allowed_token_ids": [1000]})", "allowed_token_ids",
                   "outside the vocabulary");
  ExpectBadRequest(R"({"prompt": "a", "bad_words": "no"})", "bad_words", "array");
  ExpectBadRequest(R"({"prompt": "a", "bad_words": ["ok", ""]})", "bad_words", "non-empty");
}

TEST(CompletionRequestTest, FieldsHeadwayDoesNotActOnAreRefused) {
  // Known OpenAI / vLLM fields that are not implemented yet, or belong to
  // the other endpoint.
  for (const char* field : {"guided_grammar", "messages",
                            "use_beam_search", "skip_special_tokens", "top_logprobs"}) {
    ExpectBadRequest(std::string(R"({"prompt": "a", ")") + field + R"(": 1})", field,
                     "is not supported yet");
  }
  ExpectBadRequest(R"({"prompt": "a", "temprature": 0.5})", "temprature",
                   "Unrecognized request argument supplied: temprature");
  // null counts as absent; `user` is accepted and has no effect.
  Ok(R"({"prompt": "a", "guided_grammar": null, "user": "u1"})");
  // Structured output is read on this endpoint too, as vLLM does.
  EXPECT_TRUE(Ok(R"({"prompt": "a", "guided_regex": "[ab]+"})").params.structured_output);
  ExpectBadRequest(R"({"prompt": "a", "user": 5})", "user", "string");
}

TEST(CompletionRequestTest, StreamingLogprobsAndStopTokens) {
  CompletionRequest r = Ok(R"({"prompt": "a", "stream": true,
                               "stream_options": {"include_usage": true}, "logprobs": 3,
                               "stop_token_ids": [2, 7]})");
  EXPECT_TRUE(r.params.stream);
  EXPECT_TRUE(r.params.include_usage);
  EXPECT_TRUE(r.params.sampling.logprobs);
  EXPECT_EQ(r.params.sampling.num_top_logprobs, 3);
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{2, 7}));
  r = Ok(R"({"prompt": "a", "logprobs": 0})");
  EXPECT_TRUE(r.params.sampling.logprobs);
  EXPECT_EQ(r.params.sampling.num_top_logprobs, 0);
  r = Ok(R"({"prompt": "a", "stream": true})");
  EXPECT_FALSE(r.params.include_usage);
  EXPECT_FALSE(Ok(R"({"prompt": "a"})").params.sampling.logprobs);

  ExpectBadRequest(R"({"prompt": "a", "stream_options": {"include_usage": true}})",
                   "stream_options", "only be defined when `stream=True`");
  ExpectBadRequest(R"({"prompt": "a", "stream": true, "stream_options": 1})", "stream_options",
                   "object");
  ExpectBadRequest(R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": 1}})",
                   "stream_options", "boolean");
  ExpectBadRequest(R"({"prompt": "a", "logprobs": 21})", "logprobs", "[0, 20]");
  ExpectBadRequest(R"({"prompt": "a", "logprobs": -1})", "logprobs", "[0, 20]");
  ExpectBadRequest(R"({"prompt": "a", "logprobs": true})", "logprobs", "integer");
  ExpectBadRequest(R"({"prompt": "a", "stop_token_ids": [1000]})", "stop_token_ids",
                   "outside the vocabulary");
  ExpectBadRequest(R"({"prompt": "a", "stop_token_ids": 3})", "stop_token_ids", "array");
  ExpectBadRequest(R"({"prompt": "a", "stop_token_ids": ["x"]})", "stop_token_ids", "array");
}

TEST(CompletionRequestTest, UnknownModelIs404) {
  ApiError e = Err(R"({"model": "gpt-4", "prompt": "a"})");
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.message, "The model `gpt-4` does not exist.");
  nlohmann::json j = e.ToJson();
  EXPECT_EQ(j["error"]["message"], e.message);
  EXPECT_EQ(j["error"]["code"], 404);
  EXPECT_TRUE(j["error"]["param"].is_null());
}

TEST(CompletionRequestTest, ResolveMaxTokens) {
  auto ok = [](std::variant<int, ApiError> v) { return std::get<int>(v); };
  EXPECT_EQ(ok(ResolveMaxTokens(10, std::nullopt, 64, kDefaultMaxTokens)), 16);
  EXPECT_EQ(ok(ResolveMaxTokens(60, std::nullopt, 64, kDefaultMaxTokens)), 4);
  EXPECT_EQ(ok(ResolveMaxTokens(10, 54, 64, kDefaultMaxTokens)), 54);
  EXPECT_EQ(ok(ResolveMaxTokens(10, std::nullopt, 64, 1 << 30)), 54);  // chat: all that is left

  auto err = [](std::variant<int, ApiError> v) { return std::get<ApiError>(v); };
  ApiError e = err(ResolveMaxTokens(64, std::nullopt, 64, kDefaultMaxTokens));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message,
            "This model's maximum context length is 64 tokens. However, your request has 64 "
            "input tokens. Please reduce the length of the input messages.");
  e = err(ResolveMaxTokens(10, 55, 64, kDefaultMaxTokens));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("maximum context length is 64 tokens"), std::string::npos);
  EXPECT_NE(e.message.find("you requested 65 tokens (10 in the messages, 55 in the completion)"),
            std::string::npos)
      << e.message;
}

}  // namespace
}  // namespace headway
