// POST /v1/completions bodies, as the server reads them: the JSON depth
// check, then ParseCompletionRequest, then ResolveMaxTokens on what it
// accepted. Any bytes must give a request that keeps ParseCompletionRequest's
// contract or an OpenAI-style error, never a crash.
#include <cstdint>
#include <variant>

#include "coordinator/http/completion_request.h"
#include "tests/fuzz/request_fuzz.h"

using namespace headway;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const CompletionLimits limits = fuzz::RequestLimits();
  const std::optional<CompletionRequest> parsed = fuzz::ParseRequestBody<CompletionRequest>(
      data, size, limits, [](std::string_view body, const CompletionLimits& l) {
        return ParseCompletionRequest(body, l);
      });
  if (!parsed) return 0;
  const CompletionRequest& req = *parsed;
  if (req.prompt_is_ids) {
    FUZZ_CHECK(!req.prompt_ids.empty(), "accepted an empty id prompt");
    for (int32_t id : req.prompt_ids) {
      FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "accepted id " + std::to_string(id));
    }
  } else {
    FUZZ_CHECK(!req.prompt_text.empty(), "accepted an empty text prompt");
  }
  for (int32_t id : req.params.stop_token_ids) {
    FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "accepted stop id " + std::to_string(id));
  }
  for (const std::string& s : req.params.stop) FUZZ_CHECK(!s.empty(), "accepted an empty stop");
  FUZZ_CHECK(!req.params.max_tokens || *req.params.max_tokens >= 1, "max_tokens < 1");
  FUZZ_CHECK(req.params.model.empty() || req.params.model == limits.served_model_name,
             "accepted model " + req.params.model);
  const int n = req.prompt_is_ids ? int(req.prompt_ids.size()) : int(req.prompt_text.size());
  std::variant<int, ApiError> max_tokens =
      ResolveMaxTokens(n, req.params.max_tokens, limits.max_model_len, kDefaultMaxTokens);
  if (const auto* e = std::get_if<ApiError>(&max_tokens)) {
    fuzz::CheckApiError(*e);
  } else {
    const int m = std::get<int>(max_tokens);
    FUZZ_CHECK(m >= 1 && n + m <= limits.max_model_len,
               std::to_string(n) + " + " + std::to_string(m) + " tokens");
  }
  return 0;
}
