// POST /tokenize and POST /detokenize bodies (vLLM's extension endpoints):
// parsing and validation as pure functions.
//   /tokenize   {"prompt": "text"} or {"messages": [...]} (+ "model",
//               "add_special_tokens", "add_generation_prompt")
//               -> {"count", "max_model_len", "tokens"}
//   /detokenize {"tokens": [ids]} (+ "model") -> {"prompt"}
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "coordinator/http/api_error.h"
#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/http/completion_request.h"

namespace headway {

struct TokenizeRequest {
  bool is_chat = false;
  std::string prompt;                   // when !is_chat
  std::vector<ChatMessage> messages;    // when is_chat; non-empty
  bool add_special_tokens = true;       // prompt: prepend BOS if the model adds one
  bool add_generation_prompt = true;    // messages
};

// 400 for bad JSON, a body with neither or both of prompt and messages, a
// prompt that is not a string, bad messages (ReadChatMessages), a
// non-boolean flag; 404 for another model.
std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(std::string_view body,
                                                             const CompletionLimits& limits);

// The token ids; 400 when `tokens` is missing, not an array of integers, or
// holds an id outside [0, vocab_size) (the message names it); 404 for
// another model.
std::variant<std::vector<int32_t>, ApiError> ParseDetokenizeRequest(std::string_view body,
                                                                    const CompletionLimits& limits);

}  // namespace headway
