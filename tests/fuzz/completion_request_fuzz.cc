// POST /v1/completions bodies, as the server reads them: the JSON depth
// check, then ParseCompletionRequest, then ResolveMaxTokens on what it
// accepted. Any bytes must give a request that keeps ParseCompletionRequest's
// contract or an OpenAI-style error, never a crash.
#include <cstdint>
#include <string_view>
#include <variant>

#include "common/http_config.h"
#include "coordinator/http/completion_request.h"
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
  ParsedCompletion parsed = ParseCompletionRequest(body, limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) {
    CheckError(*e);
    return 0;
  }
  const CompletionRequest& req = std::get<CompletionRequest>(parsed);
  FUZZ_CHECK(!req.prompts.empty(), "accepted no prompt");
  FUZZ_CHECK(req.params.n >= 1 &&
                 req.prompts.size() * size_t(req.params.n) <= size_t(kMaxChoicesPerRequest),
             "accepted n " + std::to_string(req.params.n) + " x " +
                 std::to_string(req.prompts.size()) + " prompts");
  for (const CompletionPrompt& prompt : req.prompts) {
    if (prompt.is_ids) {
      FUZZ_CHECK(!prompt.ids.empty(), "accepted an empty id prompt");
      for (int32_t id : prompt.ids) {
        FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "accepted id " + std::to_string(id));
      }
    } else {
      FUZZ_CHECK(!prompt.text.empty(), "accepted an empty text prompt");
    }
  }
  for (int32_t id : req.params.stop_token_ids) {
    FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "accepted stop id " + std::to_string(id));
  }
  for (const std::string& s : req.params.stop) FUZZ_CHECK(!s.empty(), "accepted an empty stop");
  FUZZ_CHECK(!req.params.max_tokens || *req.params.max_tokens >= 1, "max_tokens < 1");
  FUZZ_CHECK(req.params.model.empty() || req.params.model == limits.served_model_name,
             "accepted model " + req.params.model);
  const CompletionPrompt& first = req.prompts.front();
  const int n = first.is_ids ? int(first.ids.size()) : int(first.text.size());
  std::variant<int, ApiError> max_tokens =
      ResolveMaxTokens(n, req.params.max_tokens, limits.max_model_len, kDefaultMaxTokens);
  if (const auto* e = std::get_if<ApiError>(&max_tokens)) {
    CheckError(*e);
  } else {
    const int m = std::get<int>(max_tokens);
    FUZZ_CHECK(m >= 1 && n + m <= limits.max_model_len,
               std::to_string(n) + " + " + std::to_string(m) + " tokens");
  }
  return 0;
}
