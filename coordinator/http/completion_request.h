// POST /v1/completions request bodies: parsing and validation, as pure
// functions from JSON text to a validated request or an OpenAI-style error
// (vLLM's messages where vLLM has one). The fields shared with chat
// completions (GenerationParams) are read by ReadGenerationParams.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/http/api_error.h"
#include "coordinator/scheduling/sequence.h"
#include "coordinator/structured/grammar_compiler.h"

namespace headway {

// What the server accepts, fixed at startup.
struct CompletionLimits {
  std::string served_model_name;
  int vocab_size = 0;       // token ids in a prompt lie in [0, vocab_size)
  int max_model_len = 0;    // prompt + generated tokens
};

// Most top logprobs a request may ask for (vLLM's default max_logprobs; the
// workers' limit too).
inline constexpr int kMaxLogprobs = 20;

// Generation fields common to completions and chat completions.
struct GenerationParams {
  std::string model;                  // as sent; "" when absent
  // >= 1 when given (0 only for a completions echo: the prompt alone);
  // default applied by ResolveMaxTokens.
  std::optional<int> max_tokens;
  SamplingOptions sampling;           // logprobs and num_top_logprobs from the logprobs fields
  std::vector<std::string> stop;      // non-empty strings
  std::vector<int32_t> stop_token_ids;  // in [0, vocab_size)
  bool ignore_eos = false;            // vLLM extension
  int min_tokens = 0;                 // vLLM extension; >= 0, <= max_tokens (checked later)
  std::vector<std::string> bad_words;  // vLLM extension; tokenized by the server
  bool stream = false;                // answer with server-sent events
  bool include_usage = false;         // stream_options.include_usage (stream only)
  int prompt_logprobs = -1;           // vLLM's prompt_logprobs field, [0, 20]; -1 = absent
  int n = 1;                          // choices per prompt, [1, kMaxChoicesPerRequest]
  // response_format json_object / json_schema, guided_*, structured_outputs
  // (structured_output_fields.h); compiled by the server into sampling.grammar.
  std::optional<structured::StructuredOutputSpec> structured_output;
};

// Most choices one request may ask for: n x the number of prompts.
inline constexpr int kMaxChoicesPerRequest = 128;

// One prompt of a completions request.
struct CompletionPrompt {
  bool is_ids = false;
  std::string text;             // when !is_ids; non-empty
  std::vector<int32_t> ids;     // when is_ids; non-empty, in range
};

struct CompletionRequest {
  GenerationParams params;
  std::vector<CompletionPrompt> prompts;  // non-empty; choice i*n+j answers prompt i
  // echo: each choice's text (and logprobs, when asked) starts with its
  // prompt's. params.sampling.prompt_logprobs holds what the logprobs need:
  // params.prompt_logprobs, or with echo the logprobs field's count.
  bool echo = false;
};

using ParsedCompletion = std::variant<CompletionRequest, ApiError>;

// Reads into *out the fields both endpoints share: model (a string),
// max_tokens (>= 0; the endpoints refuse 0 but for a completions echo),
// temperature (>= 0), top_p (0, 1], top_k (>= -1),
// min_p [0, 1], seed, presence_penalty and frequency_penalty [-2, 2],
// repetition_penalty (> 0), logit_bias (an object of token id -> number
// in [-100, 100], ids in the vocabulary, as OpenAI's), min_tokens (>= 0),
// allowed_token_ids (non-empty, in the vocabulary), bad_words (non-empty
// strings),
// stop (a string or array of strings), stop_token_ids (ids in the
// vocabulary), ignore_eos, stream, stream_options ({include_usage: bool},
// only with stream: true, as vLLM), n (>= 1), prompt_logprobs (vLLM's: an
// integer in [0, 20]; into sampling too), and refuses options Headway
// lacks (best_of > 1). The ranges are vLLM's SamplingParams
// checks. Returns the first error (400 naming the field), or nullopt.
std::optional<ApiError> ReadGenerationParams(const nlohmann::json& body,
                                             const CompletionLimits& limits,
                                             GenerationParams* out);

// 400 for a max_tokens of 0 where the prompt alone is not asked for (all
// but a non-streamed completions echo): vLLM's "max_tokens must be at
// least 1, got 0.".
ApiError ZeroMaxTokens();

// 404 ("The model `x` does not exist.") unless `model` is "" or the served
// name; checked last, as vLLM does, so a malformed request is a 400 first.
std::optional<ApiError> CheckModel(const std::string& model, const CompletionLimits& limits);

// Parses and checks everything that does not need the tokenizer: JSON
// syntax (400), an object body, ReadGenerationParams's fields, logprobs (an
// integer in [0, 20]: the legacy API's number of top logprobs), echo (a
// bool), max_tokens 0 (only with echo and not streamed: the prompt alone),
// suffix ("" only: 400 saying so), the prompt (a string, a list of
// token ids, or a non-empty list of either; an empty or missing one is
// 400), prompt token ids outside the vocabulary (400), n x prompts over
// kMaxChoicesPerRequest (400), and the model (CheckModel).
// Fields outside CheckFieldNames's policy (request_field_policy.h) are
// refused first: unlike vLLM, which ignores unknown fields, Headway never
// accepts a field it does not act on.
ParsedCompletion ParseCompletionRequest(std::string_view body, const CompletionLimits& limits);

// Checks the tokenized prompt against max_model_len and returns the number
// of tokens to generate: `max_tokens` if given, else what is left of
// max_model_len (vLLM's default) capped at `default_max_tokens`.
// Errors (400, vLLM's wording): the prompt alone fills max_model_len ("This
// model's maximum context length is N tokens. However, your request has M
// input tokens. ..."), or prompt + max_tokens exceeds it (naming all three
// numbers).
std::variant<int, ApiError> ResolveMaxTokens(int num_prompt_tokens,
                                             std::optional<int> max_tokens,
                                             int max_model_len,
                                             int default_max_tokens);

// OpenAI's default when max_tokens is absent from a completion request.
inline constexpr int kDefaultMaxTokens = 16;

}  // namespace headway
