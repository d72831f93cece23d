// Checks that refuse an oversized request before it costs much: before the
// JSON parser builds a tree, and before the tokenizer runs.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "coordinator/http/api_error.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

// 400 when `text` nests arrays and objects more than `max_depth` deep
// (`[[1]]` is 2 deep), naming coordinator.http_max_json_depth; nullopt
// otherwise, also for text that is not JSON (the parser reports that).
// One pass, no allocation: it runs before nlohmann::json builds the tree
// whose size a deep document would set.
std::optional<ApiError> CheckJsonDepth(std::string_view text, int max_depth);

// The most bytes of text one token can stand for in `tokenizer`: the
// longest vocabulary text or decoded bytes of any token, and at least 4
// (one UTF-8 character that becomes an unknown token). A text of B bytes
// therefore encodes to at least ceil(B / MaxTokenBytes) tokens.
size_t MaxTokenBytes(const Tokenizer& tokenizer);

// 400 with vLLM's context-length wording when a prompt of `prompt_bytes`
// bytes must encode to at least max_model_len tokens (see MaxTokenBytes),
// so it is refused without tokenizing it; nullopt when it may fit.
// `param` names the field ("prompt", "messages").
std::optional<ApiError> CheckPromptBytes(size_t prompt_bytes, size_t max_token_bytes,
                                         int max_model_len, const char* param);

}  // namespace headway
