#include "coordinator/http/tokenize_request.h"

#include "coordinator/http/chat_request.h"
#include "coordinator/http/request_fields.h"

namespace headway {

using nlohmann::json;
using namespace request_fields;

namespace {

std::optional<ApiError> ReadModel(const json& body, const CompletionLimits& limits) {
  std::string model;
  if (const json* m = Field(body, "model")) {
    if (!m->is_string()) return WrongType("model", "a string");
    model = m->get<std::string>();
  }
  return CheckModel(model, limits);
}

}  // namespace

std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(std::string_view text,
                                                             const CompletionLimits& limits) {
  json body;
  if (auto e = ParseObject(text, &body)) return *e;
  TokenizeRequest req;
  const json* prompt = Field(body, "prompt");
  const json* messages = Field(body, "messages");
  if ((prompt == nullptr) == (messages == nullptr)) {
    return ApiError::BadRequest("give exactly one of 'prompt' and 'messages'", prompt ? "messages" : "prompt");
  }
  if (prompt) {
    if (!prompt->is_string()) return WrongType("prompt", "a string");
    req.prompt = prompt->get<std::string>();
  } else {
    req.is_chat = true;
    if (auto e = ReadChatMessages(*messages, &req.messages)) return *e;
  }
  if (auto e = ReadBool(body, "add_special_tokens", &req.add_special_tokens)) return *e;
  if (auto e = ReadBool(body, "add_generation_prompt", &req.add_generation_prompt)) return *e;
  if (auto e = ReadModel(body, limits)) return *e;
  return req;
}

std::variant<std::vector<int32_t>, ApiError> ParseDetokenizeRequest(std::string_view text,
                                                                    const CompletionLimits& limits) {
  json body;
  if (auto e = ParseObject(text, &body)) return *e;
  const json* tokens = Field(body, "tokens");
  if (!tokens) return ApiError::BadRequest("'tokens' is required", "tokens");
  std::vector<int32_t> ids;
  if (auto e = ReadTokenIds(*tokens, "tokens", limits.vocab_size, &ids)) return *e;
  if (auto e = ReadModel(body, limits)) return *e;
  return ids;
}

}  // namespace headway
