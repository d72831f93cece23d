// POST /v1/chat/completions bodies, as the server reads them: the JSON
// depth check, then ParseChatRequest. Any bytes must give a request that
// keeps ParseChatRequest's contract or an OpenAI-style error, never a crash.
#include <cstdint>
#include <string_view>
#include <variant>

#include "common/http_config.h"
#include "coordinator/http/chat_request.h"
#include "coordinator/http/request_limits.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;

void CheckError(const ApiError& e) {
  FUZZ_CHECK(e.http_status == 400 || e.http_status == 404, e.message);
  FUZZ_CHECK(!e.message.empty(), "an error without a message");
  (void)e.ToJson().dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  // The server refuses deeper bodies before it parses them (api_server.cc).
  if (auto e = CheckJsonDepth(body, HttpApiConfig{}.max_json_depth)) {
    CheckError(*e);
    return 0;
  }
  CompletionLimits limits;
  limits.served_model_name = "m";
  limits.vocab_size = 100;
  limits.max_model_len = 64;
  ParsedChat parsed = ParseChatRequest(body, limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) {
    CheckError(*e);
    return 0;
  }
  const ChatRequest& req = std::get<ChatRequest>(parsed);
  FUZZ_CHECK(!req.messages.empty(), "accepted no messages");
  for (const ChatMessage& m : req.messages) {
    FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
               "accepted role " + m.role);
  }
  FUZZ_CHECK(!req.params.max_tokens || *req.params.max_tokens >= 1, "max_tokens < 1");
  const int n = req.params.sampling.num_top_logprobs;
  FUZZ_CHECK(n >= 0 && n <= kMaxLogprobs, "top_logprobs " + std::to_string(n));
  FUZZ_CHECK(n == 0 || req.params.sampling.logprobs, "top_logprobs without logprobs");
  FUZZ_CHECK(req.params.model.empty() || req.params.model == limits.served_model_name,
             "accepted model " + req.params.model);
  return 0;
}
