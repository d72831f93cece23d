// POST /v1/chat/completions request bodies: parsing and validation, as a
// pure function from JSON text to a validated request or an OpenAI-style
// error (vLLM's messages where vLLM has one).
#pragma once

#include <string_view>
#include <variant>
#include <vector>

#include "coordinator/http/api_error.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/http/completion_request.h"

namespace headway {

struct ChatRequest {
  GenerationParams params;
  std::vector<ChatMessage> messages;  // non-empty
  bool add_generation_prompt = true;  // vLLM extension; OpenAI always true
  // vLLM extension: each answer starts with the last message's content when
  // that message has the answer's role (assistant with
  // add_generation_prompt, else the last message's own).
  bool echo = false;
};

using ParsedChat = std::variant<ChatRequest, ApiError>;

// Checks, each a 400 naming the field unless said otherwise: JSON syntax
// and an object body; ReadGenerationParams's fields; max_completion_tokens
// (>= 1; wins over the older max_tokens, as in vLLM); logprobs (a boolean)
// and top_logprobs (an integer in [0, 20], only with logprobs: true);
// `messages`: a non-empty array of objects whose role is "system", "user"
// or "assistant" and whose content is a string or an array of
// {"type": "text", "text": string} parts (joined with "\n", as vLLM does;
// other part types are refused; an assistant's content may be null);
// tools / functions (not supported: 400) and tool_choice ("none" or
// "auto" only); parallel_tool_calls (a boolean, no effect without tools);
// response_format ({"type": "text"} only: other types are 400, not yet
// supported); add_generation_prompt and echo (booleans); prompt_logprobs
// not with stream (400, not yet); max_tokens 0 (400); and the model (404,
// CheckModel). Fields outside CheckFieldNames's policy are refused first.
ParsedChat ParseChatRequest(std::string_view body, const CompletionLimits& limits);

// Reads a `messages` array (as ParseChatRequest) into *out.
std::optional<ApiError> ReadChatMessages(const nlohmann::json& messages,
                                         std::vector<ChatMessage>* out);

}  // namespace headway
