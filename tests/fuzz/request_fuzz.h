// What the two OpenAI request harnesses (completion_request_fuzz.cc,
// chat_request_fuzz.cc) share: the limits they parse under, the contract
// of an error, and the server's order of checks (JSON depth first).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "common/http_config.h"
#include "coordinator/http/api_error.h"
#include "coordinator/http/request_limits.h"
#include "tests/fuzz/fuzz_check.h"

namespace headway::fuzz {

// An error a request parser may give: 400 or 404, with a message, that
// renders as OpenAI JSON.
inline void CheckApiError(const ApiError& e) {
  FUZZ_CHECK(e.http_status == 400 || e.http_status == 404, e.message);
  FUZZ_CHECK(!e.message.empty(), "an error without a message");
  (void)e.ToJson().dump();
}

// The limits both harnesses parse under: model "m", 100 ids, 64 positions.
inline CompletionLimits RequestLimits() {
  CompletionLimits limits;
  limits.served_model_name = "m";
  limits.vocab_size = 100;
  limits.max_model_len = 64;
  return limits;
}

// `data` as a request body, read as the server reads it: refused when
// deeper than the default max_json_depth (api_server.cc), then `parse(body,
// limits)`, which returns std::variant<Request, ApiError>. Errors are
// checked with CheckApiError; the accepted request, or nothing, is returned.
template <typename Request, typename Parse>
std::optional<Request> ParseRequestBody(const uint8_t* data, size_t size,
                                        const CompletionLimits& limits, Parse parse) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  if (auto e = CheckJsonDepth(body, HttpApiConfig{}.max_json_depth)) {
    CheckApiError(*e);
    return std::nullopt;
  }
  auto parsed = parse(body, limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) {
    CheckApiError(*e);
    return std::nullopt;
  }
  return std::get<Request>(std::move(parsed));
}

}  // namespace headway::fuzz
