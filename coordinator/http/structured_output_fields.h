// The structured-output fields of a request: OpenAI's response_format
// ({"type": "json_object"} and {"type": "json_schema", "json_schema":
// {"name", "schema", "strict", "description"}}), vLLM's guided_json,
// guided_regex, guided_choice, guided_whitespace_pattern and
// guided_decoding_backend, and vLLM's newer structured_outputs object
// ({"json" | "regex" | "choice" | "json_object", "whitespace_pattern"}).
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "coordinator/http/api_error.h"
#include "coordinator/http/completion_request.h"
#include "coordinator/structured/grammar_compiler.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

// Reads the fields above from `body` into *out (left empty when the request
// has no constraint; response_format {"type": "text"} is none). A schema is
// taken from `body_text` again so that its properties keep their order.
// Errors (400 naming the field): a malformed value, more than one
// constraint, guided_grammar and structured_outputs.grammar (no grammar
// language is implemented), unknown keys in response_format, json_schema or
// structured_outputs, a whitespace pattern without JSON output, and a
// constraint together with min_tokens, bad_words or allowed_token_ids of
// `params` (their bans could leave no token to sample).
std::optional<ApiError> ReadStructuredOutput(const nlohmann::json& body,
                                             std::string_view body_text,
                                             const GenerationParams& params,
                                             std::optional<structured::StructuredOutputSpec>* out);

// The vocabulary as grammars see it: each token's bytes; special tokens
// (EOS, <|im_end|>, ...) are never part of a structured output.
std::shared_ptr<const structured::TokenVocabulary> GrammarVocabulary(const Tokenizer& tokenizer);

}  // namespace headway
