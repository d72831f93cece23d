// POST /v1/completions request bodies: parsing and validation, as pure
// functions from JSON text to a validated request or an OpenAI-style error
// (vLLM's messages where vLLM has one).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "coordinator/api_error.h"
#include "coordinator/sequence.h"

namespace headway {

// What the server accepts, fixed at startup.
struct CompletionLimits {
  std::string served_model_name;
  int vocab_size = 0;       // token ids in a prompt lie in [0, vocab_size)
  int max_model_len = 0;    // prompt + generated tokens
};

struct CompletionRequest {
  std::string model;                  // as sent; "" when absent
  bool prompt_is_ids = false;
  std::string prompt_text;            // when !prompt_is_ids; non-empty
  std::vector<int32_t> prompt_ids;    // when prompt_is_ids; non-empty, in range
  std::optional<int> max_tokens;      // >= 1 when given; default applied by ResolveMaxTokens
  SamplingOptions sampling;
  std::vector<std::string> stop;      // non-empty strings
  bool ignore_eos = false;            // vLLM extension
};

using ParsedCompletion = std::variant<CompletionRequest, ApiError>;

// Parses and checks everything that does not need the tokenizer: JSON
// syntax (400), an object body, field types (400 naming the field), ranges
// (max_tokens >= 1, temperature >= 0, 0 < top_p <= 1, top_k >= -1, n == 1),
// unsupported options (stream, echo, logprobs, best_of > 1, suffix,
// penalties: 400 saying so), an empty or missing prompt (400), prompt token
// ids outside the vocabulary (400), and the model name (404 unless absent or
// equal to served_model_name). Unknown fields are ignored, as vLLM does.
ParsedCompletion ParseCompletionRequest(std::string_view body, const CompletionLimits& limits);

// Checks the tokenized prompt against max_model_len and returns the number
// of tokens to generate: `max_tokens` if given, else min(16, what is left).
// Errors (400, vLLM's wording): the prompt alone fills max_model_len ("This
// model's maximum context length is N tokens. However, your request has M
// input tokens. ..."), or prompt + max_tokens exceeds it (naming all three
// numbers).
std::variant<int, ApiError> ResolveMaxTokens(int num_prompt_tokens,
                                             std::optional<int> max_tokens,
                                             int max_model_len);

// OpenAI's default when max_tokens is absent from a completion request.
inline constexpr int kDefaultMaxTokens = 16;

}  // namespace headway
