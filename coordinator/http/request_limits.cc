#include "coordinator/http/request_limits.h"

#include <algorithm>
#include <string>

namespace headway {

std::optional<ApiError> CheckJsonDepth(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // an escaped character, '"' included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return ApiError::BadRequest("the request body nests JSON more than " +
                                    std::to_string(max_depth) +
                                    " levels deep (coordinator.http_max_json_depth)");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

size_t MaxTokenBytes(const Tokenizer& tokenizer) {
  size_t longest = 4;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    longest = std::max(longest, tokenizer.TokenBytes(id).size());
    Result<std::string_view> text = tokenizer.TokenText(id);
    if (text.ok()) longest = std::max(longest, text->size());
  }
  return longest;
}

std::optional<ApiError> CheckPromptBytes(size_t prompt_bytes, size_t max_token_bytes,
                                         int max_model_len, const char* param) {
  const size_t min_tokens = (prompt_bytes + max_token_bytes - 1) / max_token_bytes;
  if (min_tokens < size_t(max_model_len)) return std::nullopt;
  return ApiError::BadRequest(
      "This model's maximum context length is " + std::to_string(max_model_len) +
          " tokens. However, your request has at least " + std::to_string(min_tokens) +
          " input tokens (" + std::to_string(prompt_bytes) +
          " bytes of text, and no token stands for more than " + std::to_string(max_token_bytes) +
          " bytes). Please reduce the length of the input messages.",
      param);
}

}  // namespace headway
