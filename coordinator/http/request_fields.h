// Typed reads of JSON request fields with OpenAI-style 400 errors naming the
// field, shared by the request parsers (completion_request.h,
// chat_request.h, tokenize_request.h). A field that is absent or JSON null
// counts as not given; each Read* leaves *out unchanged then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/http/api_error.h"

namespace headway::request_fields {

// The field, or nullptr when absent or null.
const nlohmann::json* Field(const nlohmann::json& body, const char* name);

// 400: "'<name>' must be <expected>", param = name.
ApiError WrongType(const std::string& name, const char* expected);

// 400: "<what> is not supported yet", param = name.
ApiError Unsupported(const std::string& name, const std::string& what);

// A finite number.
std::optional<ApiError> ReadNumber(const nlohmann::json& body, const char* name,
                                   std::optional<double>* out);
// An integer that fits int64.
std::optional<ApiError> ReadInteger(const nlohmann::json& body, const char* name,
                                    std::optional<int64_t>* out);
std::optional<ApiError> ReadBool(const nlohmann::json& body, const char* name, bool* out);

// An integer (ReadInteger) in [lo, hi], else 400 in vLLM's wording:
// "<name> <requirement>, got <value>." (e.g. requirement "must be at least
// 1"). A value above INT_MAX is stored as INT_MAX.
std::optional<ApiError> ReadIntInRange(const nlohmann::json& body, const char* name, int64_t lo,
                                       int64_t hi, const std::string& requirement,
                                       std::optional<int>* out);

// An array of token ids, each in [0, vocab_size); `name` names the field in
// errors.
std::optional<ApiError> ReadTokenIds(const nlohmann::json& array, const std::string& name,
                                     int vocab_size, std::vector<int32_t>* ids);

// Parses `text` as a JSON object, or 400 ("not valid JSON" / "must be a JSON
// object").
std::optional<ApiError> ParseObject(std::string_view text, nlohmann::json* body);

}  // namespace headway::request_fields
