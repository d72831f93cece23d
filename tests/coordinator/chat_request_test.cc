#include "coordinator/http/chat_request.h"

#include <gtest/gtest.h>

#include "coordinator/http/tokenize_request.h"

namespace headway {
namespace {

const CompletionLimits kLimits{"smollm2", 1000, 64};

ChatRequest Ok(const std::string& body) {
  ParsedChat p = ParseChatRequest(body, kLimits);
  if (auto* e = std::get_if<ApiError>(&p)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<ChatRequest>(p);
}

void ExpectBadRequest(const std::string& body, const std::string& param, const std::string& fragment) {
  ParsedChat p = ParseChatRequest(body, kLimits);
  auto* e = std::get_if<ApiError>(&p);
  ASSERT_NE(e, nullptr) << body << " was accepted";
  EXPECT_EQ(e->http_status, 400) << body;
  EXPECT_EQ(e->type, "invalid_request_error");
  EXPECT_EQ(e->param, param) << body;
  EXPECT_NE(e->message.find(fragment), std::string::npos) << body << " -> " << e->message;
}

using Kind = structured::StructuredOutputSpec::Kind;

TEST(ChatRequestTest, StructuredOutputFields) {
  const char* ok_messages = R"("messages": [{"role": "user", "content": "x"}])";
  auto with = [&](const std::string& fields) { return std::string("{") + ok_messages + ", " + fields + "}"; };
  // The schema keeps the client's property order (the body's parse sorts keys).
  ChatRequest r = Ok(with(R"("response_format": {"type": "json_schema", "json_schema": {
      "name": "p", "strict": true, "schema": {"type": "object",
      "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}}})"));
  ASSERT_TRUE(r.params.structured_output);
  EXPECT_EQ(r.params.structured_output->kind, Kind::kJsonSchema);
  EXPECT_EQ(r.params.structured_output->field, "response_format");
  EXPECT_LT(r.params.structured_output->source.find("\"z\""),
            r.params.structured_output->source.find("\"a\""));
  r = Ok(with(R"("response_format": {"type": "json_object"}, "guided_whitespace_pattern": "[ ]*")"));
  EXPECT_EQ(r.params.structured_output->kind, Kind::kJsonObject);
  EXPECT_EQ(r.params.structured_output->whitespace_pattern, "[ ]*");
  r = Ok(with(R"("guided_json": "{\"type\": \"integer\"}", "guided_decoding_backend": "xgrammar")"));
  EXPECT_EQ(r.params.structured_output->source, R"({"type":"integer"})");
  r = Ok(with(R"("guided_choice": ["a", "b"])"));
  EXPECT_EQ(r.params.structured_output->kind, Kind::kChoice);
  r = Ok(with(R"("structured_outputs": {"regex": "[ab]+"})"));
  EXPECT_EQ(r.params.structured_output->kind, Kind::kRegex);
  EXPECT_EQ(r.params.structured_output->field, "structured_outputs.regex");
  EXPECT_FALSE(Ok(with(R"("response_format": {"type": "text"})")).params.structured_output);

  ExpectBadRequest(with(R"("response_format": {"type": "json_schema"})"),
                   "response_format.json_schema", "'schema'");
  ExpectBadRequest(with(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})"),
                   "response_format.json_schema", "is required");
  ExpectBadRequest(with(R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}}})"),
                   "response_format.json_schema.name", "a string");
  ExpectBadRequest(with(R"("response_format": {"type": "json_object"}, "guided_whitespace_pattern": "x")"),
                   "guided_whitespace_pattern", "JSON whitespace");
  ExpectBadRequest(with(R"("structured_outputs": {"whitespace_pattern": " "})"),
                   "structured_outputs.whitespace_pattern", "JSON output only");
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "[";
  for (int i = 0; i < 5000; ++i) deep += "]";
  ExpectBadRequest(with(R"("guided_json": ")" + deep + "\""), "guided_json", "nest");
  ExpectBadRequest(with(R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}})"),
                   "response_format.json_schema", "'response_format.json_schema.extra'");
  ExpectBadRequest(with(R"("guided_regex": "a", "guided_choice": ["a"])"), "guided_choice",
                   "only one kind of structured output");
  ExpectBadRequest(with(R"("guided_choice": [])"), "guided_choice", "non-empty array");
  ExpectBadRequest(with(R"("guided_choice": ["a", 1])"), "guided_choice", "strings");
  ExpectBadRequest(with(R"("guided_regex": 5)"), "guided_regex", "string");
  ExpectBadRequest(with(R"("guided_json": "{nope")"), "guided_json", "JSON schema");
  ExpectBadRequest(with(R"("structured_outputs": {"grammar": "x"})"), "structured_outputs",
                   "grammar");
  ExpectBadRequest(with(R"("structured_outputs": {"json": {}, "choice": ["a"]})"),
                   "structured_outputs.choice", "only one kind");
  ExpectBadRequest(with(R"("guided_regex": "a", "guided_whitespace_pattern": " ")"),
                   "guided_whitespace_pattern", "JSON output only");
  ExpectBadRequest(with(R"("guided_regex": "a", "min_tokens": 1)"), "min_tokens",
                   "cannot be combined");
  ExpectBadRequest(with(R"("guided_regex": "a", "bad_words": ["x"])"), "bad_words",
                   "cannot be combined");
  ExpectBadRequest(with(R"("guided_regex": "a", "allowed_token_ids": [1])"), "allowed_token_ids",
                   "cannot be combined");
}

TEST(ChatRequestTest, Messages) {
  ChatRequest r = Ok(R"({"model": "smollm2", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "Bye", "name": "ignored"}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].content, "Hi\nthere");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].content, "Bye");
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.params.max_tokens.has_value());
  EXPECT_FALSE(r.params.sampling.logprobs);
}

TEST(ChatRequestTest, Fields) {
  ChatRequest r = Ok(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
                         "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 4,
                         "stream": true, "stream_options": {"include_usage": true},
                         "stop": ["a"], "stop_token_ids": [2], "ignore_eos": true, "temperature": 0,
                         "add_generation_prompt": false, "tools": []})");
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_TRUE(r.params.sampling.logprobs);
  EXPECT_EQ(r.params.sampling.num_top_logprobs, 4);
  EXPECT_TRUE(r.params.stream);
  EXPECT_TRUE(r.params.include_usage);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"a"});
  EXPECT_EQ(r.params.stop_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_EQ(Ok(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9})").params.max_tokens, 9);
}

TEST(ChatRequestTest, Errors) {
  ExpectBadRequest("{", "", "not valid JSON");
  ExpectBadRequest(R"({"model": "smollm2"})", "messages", "required");
  ExpectBadRequest(R"({"messages": []})", "messages", "must not be empty");
  ExpectBadRequest(R"({"messages": "hi"})", "messages", "array");
  ExpectBadRequest(R"({"messages": [3]})", "messages", "messages[0]' must be an object");
  ExpectBadRequest(R"({"messages": [{"content": "x"}]})", "messages", "role");
  ExpectBadRequest(R"({"messages": [{"role": "tool", "content": "x"}]})", "messages",
                   "supported roles are system, user and assistant");
  ExpectBadRequest(R"({"messages": [{"role": "user"}]})", "messages", "content' is required");
  ExpectBadRequest(R"({"messages": [{"role": "user", "content": 5}]})", "messages", "string or an array");
  ExpectBadRequest(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
                   "messages", "'image_url'");
  ExpectBadRequest(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages",
                   "text' must be a string");
  const char* ok_messages = R"("messages": [{"role": "user", "content": "x"}])";
  auto with = [&](const std::string& fields) { return std::string("{") + ok_messages + ", " + fields + "}"; };
  ExpectBadRequest(with(R"("max_completion_tokens": 0)"), "max_completion_tokens", "at least 1");
  ExpectBadRequest(with(R"("logprobs": 1)"), "logprobs", "boolean");
  ExpectBadRequest(with(R"("top_logprobs": 2)"), "top_logprobs", "`logprobs` must be set to true");
  ExpectBadRequest(with(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs", "[0, 20]");
  ExpectBadRequest(with(R"("tools": [{"type": "function"}])"), "tools", "not supported");
  ExpectBadRequest(with(R"("n": 0)"), "n", "[1, 128]");
  EXPECT_EQ(Ok(with(R"("n": 3)")).params.n, 3);
  ExpectBadRequest(with(R"("stream_options": {"include_usage": true})"), "stream_options", "stream=True");
  ExpectBadRequest(with(R"("add_generation_prompt": "yes")"), "add_generation_prompt", "boolean");
  ExpectBadRequest(with(R"("response_format": {"type": "xml"})"), "response_format",
                   "response_format type 'xml' is not one of 'text', 'json_object', 'json_schema'");
  ExpectBadRequest(with(R"("response_format": "json")"), "response_format", "'type'");
  ExpectBadRequest(with(R"("tool_choice": "required")"), "tool_choice", "not supported yet");
  ExpectBadRequest(with(R"("parallel_tool_calls": 1)"), "parallel_tool_calls", "boolean");
  ExpectBadRequest(with(R"("guided_grammar": "root ::= \"a\"")"), "guided_grammar",
                   "not supported yet");
  EXPECT_TRUE(Ok(with(R"("echo": true)")).echo);
  EXPECT_FALSE(Ok(with(R"("echo": false)")).echo);
  ExpectBadRequest(with(R"("echo": "yes")"), "echo", "boolean");
  EXPECT_EQ(Ok(with(R"("prompt_logprobs": 1)")).params.sampling.prompt_logprobs, 1);
  ExpectBadRequest(with(R"("prompt_logprobs": 1, "stream": true)"), "prompt_logprobs",
                   "prompt_logprobs with stream: true is not supported yet");
  ExpectBadRequest(with(R"("prompt": "x")"), "prompt", "not supported yet");
  ExpectBadRequest(with(R"("max_token": 5)"), "max_token",
                   "Unrecognized request argument supplied: max_token");
  ExpectBadRequest(with(R"("presence_penalty": -2.5)"), "presence_penalty", "[-2, 2]");
  // Accepted: plain text, no tools, and fields with no effect.
  Ok(with(R"("response_format": {"type": "text"}, "tool_choice": "none",
             "parallel_tool_calls": false, "user": "u", "min_p": 0.1, "min_tokens": 2,
             "logit_bias": {"3": -100}, "repetition_penalty": 1.1)"));

  ParsedChat p = ParseChatRequest(with(R"("model": "other")"), kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(p));
  EXPECT_EQ(std::get<ApiError>(p).http_status, 404);
}

TEST(TokenizeRequestTest, PromptMessagesAndErrors) {
  auto t = ParseTokenizeRequest(R"({"prompt": "hello", "add_special_tokens": false})", kLimits);
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_FALSE(std::get<TokenizeRequest>(t).is_chat);
  EXPECT_EQ(std::get<TokenizeRequest>(t).prompt, "hello");
  EXPECT_FALSE(std::get<TokenizeRequest>(t).add_special_tokens);
  t = ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "x"}]})", kLimits);
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_TRUE(std::get<TokenizeRequest>(t).is_chat);

  for (const char* bad : {"{}", R"({"prompt": "a", "messages": []})", R"({"prompt": 1})",
                          R"({"messages": []})", "nope"}) {
    auto r = ParseTokenizeRequest(bad, kLimits);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << bad;
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400) << bad;
  }
  auto m = ParseTokenizeRequest(R"({"prompt": "a", "model": "x"})", kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(m));
  EXPECT_EQ(std::get<ApiError>(m).http_status, 404);

  auto d = ParseDetokenizeRequest(R"({"tokens": [1, 2, 999]})", kLimits);
  ASSERT_TRUE(std::holds_alternative<std::vector<int32_t>>(d));
  EXPECT_EQ(std::get<std::vector<int32_t>>(d), (std::vector<int32_t>{1, 2, 999}));
  for (const char* bad : {R"({})", R"({"tokens": [1000]})", R"({"tokens": [-1]})", R"({"tokens": "a"})"}) {
    auto r = ParseDetokenizeRequest(bad, kLimits);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << bad;
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400) << bad;
    EXPECT_EQ(std::get<ApiError>(r).param, "tokens") << bad;
  }
}

}  // namespace
}  // namespace headway
