#include "coordinator/http/chat_request.h"

#include <algorithm>
#include <limits>

#include "coordinator/http/request_field_policy.h"
#include "coordinator/http/request_fields.h"
#include "coordinator/http/structured_output_fields.h"

namespace headway {

using nlohmann::json;
using namespace request_fields;

std::optional<ApiError> ReadChatMessages(const json& messages, std::vector<ChatMessage>* out) {
  if (!messages.is_array()) return WrongType("messages", "an array of messages");
  if (messages.empty()) return ApiError::BadRequest("'messages' must not be empty", "messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return ApiError::BadRequest("'" + where + "' must be an object", "messages");
    const json* role = Field(m, "role");
    if (!role || !role->is_string()) {
      return ApiError::BadRequest("'" + where + ".role' must be a string", "messages");
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      return ApiError::BadRequest("'" + where + ".role' is '" + msg.role +
                                      "'; supported roles are system, user and assistant",
                                  "messages");
    }
    const json* content = Field(m, "content");
    if (!content) {
      if (msg.role != "assistant") {
        return ApiError::BadRequest("'" + where + ".content' is required", "messages");
      }
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      std::vector<std::string> texts;
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        std::string pw = where + ".content[" + std::to_string(k) + "]";
        const json* type = part.is_object() ? Field(part, "type") : nullptr;
        if (!type || !type->is_string()) {
          return ApiError::BadRequest("'" + pw + "' must be an object with a string 'type'", "messages");
        }
        if (type->get<std::string>() != "text") {
          return ApiError::BadRequest("content part type '" + type->get<std::string>() + "' in '" + pw +
                                          "' is not supported (only 'text')",
                                      "messages");
        }
        const json* text = Field(part, "text");
        if (!text || !text->is_string()) {
          return ApiError::BadRequest("'" + pw + ".text' must be a string", "messages");
        }
        texts.push_back(text->get<std::string>());
      }
      for (size_t k = 0; k < texts.size(); ++k) msg.content += (k ? "\n" : "") + texts[k];
    } else {
      return ApiError::BadRequest("'" + where + ".content' must be a string or an array of content parts",
                                  "messages");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

ParsedChat ParseChatRequest(std::string_view body_text, const CompletionLimits& limits) {
  json body;
  if (auto e = ParseObject(body_text, &body)) return *e;
  if (auto e = CheckFieldNames(body, ApiEndpoint::kChatCompletions)) return *e;
  ChatRequest req;
  bool parallel_tool_calls = true;  // checked, no effect without tools
  if (auto e = ReadGenerationParams(body, limits, &req.params)) return *e;
  if (auto e = ReadBool(body, "echo", &req.echo)) return *e;
  if (req.params.stream && req.params.prompt_logprobs >= 0) {
    return Unsupported("prompt_logprobs", "prompt_logprobs with stream: true");
  }

  // Wins over the older max_tokens, as in vLLM.
  std::optional<int> max_completion_tokens;
  if (auto e = ReadIntInRange(body, "max_completion_tokens", 1,
                              std::numeric_limits<int64_t>::max(), "must be at least 1",
                              &max_completion_tokens)) {
    return *e;
  }
  if (max_completion_tokens) req.params.max_tokens = max_completion_tokens;
  if (req.params.max_tokens == 0) return ZeroMaxTokens();

  if (auto e = ReadBool(body, "logprobs", &req.params.sampling.logprobs)) return *e;
  std::optional<int> top_logprobs;
  if (auto e = ReadIntInRange(body, "top_logprobs", 0, kMaxLogprobs,
                              "must be in [0, " + std::to_string(kMaxLogprobs) + "]",
                              &top_logprobs)) {
    return *e;
  }
  if (top_logprobs) {
    if (*top_logprobs > 0 && !req.params.sampling.logprobs) {
      return ApiError::BadRequest("when using `top_logprobs`, `logprobs` must be set to true.",
                                  "top_logprobs");
    }
    req.params.sampling.num_top_logprobs = *top_logprobs;
  }
  for (const char* name : {"tools", "functions"}) {
    const json* t = Field(body, name);
    if (t && !(t->is_array() && t->empty())) return Unsupported(name, std::string(name));
  }
  // Without tools, "none" and "auto" both mean plain text.
  if (const json* choice = Field(body, "tool_choice")) {
    if (!(choice->is_string() && (*choice == "none" || *choice == "auto"))) {
      return Unsupported("tool_choice", "tool_choice other than \"none\" or \"auto\"");
    }
  }
  if (auto e = ReadBool(body, "parallel_tool_calls", &parallel_tool_calls)) return *e;
  if (auto e = ReadStructuredOutput(body, body_text, req.params, &req.params.structured_output)) {
    return *e;
  }
  if (auto e = ReadBool(body, "add_generation_prompt", &req.add_generation_prompt)) return *e;
  const json* messages = Field(body, "messages");
  if (!messages) return ApiError::BadRequest("'messages' is required", "messages");
  if (auto e = ReadChatMessages(*messages, &req.messages)) return *e;
  if (auto e = CheckModel(req.params.model, limits)) return *e;
  return req;
}

}  // namespace headway
