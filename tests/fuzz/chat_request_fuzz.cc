// POST /v1/chat/completions bodies, as the server reads them: the JSON
// depth check, then ParseChatRequest. Any bytes must give a request that
// keeps ParseChatRequest's contract or an OpenAI-style error, never a crash.
#include <cstdint>
#include <variant>

#include "coordinator/http/chat_request.h"
#include "tests/fuzz/request_fuzz.h"

using namespace headway;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const CompletionLimits limits = fuzz::RequestLimits();
  const std::optional<ChatRequest> parsed = fuzz::ParseRequestBody<ChatRequest>(
      data, size, limits, [](std::string_view body, const CompletionLimits& l) {
        return ParseChatRequest(body, l);
      });
  if (!parsed) return 0;
  const ChatRequest& req = *parsed;
  FUZZ_CHECK(!req.messages.empty(), "accepted no messages");
  for (const ChatMessage& m : req.messages) {
    FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
               "accepted role " + m.role);
  }
  FUZZ_CHECK(!req.params.max_tokens || *req.params.max_tokens >= 1, "max_tokens < 1");
  const int n = req.params.sampling.num_top_logprobs;
  FUZZ_CHECK(n >= 0 && n <= kMaxLogprobs, "top_logprobs " + std::to_string(n));
  FUZZ_CHECK(n == 0 || req.params.logprobs, "top_logprobs without logprobs");
  FUZZ_CHECK(req.params.model.empty() || req.params.model == limits.served_model_name,
             "accepted model " + req.params.model);
  return 0;
}
