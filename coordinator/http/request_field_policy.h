// Which top-level request fields each OpenAI endpoint takes. A field that
// Headway does not implement is refused with 400 naming it, never accepted
// and ignored: it could change what the client expects of the answer
// (response_format, guided_json, ...). The README's "Request fields" table
// lists the same fields with the reasons.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/http/api_error.h"

namespace headway {

enum class ApiEndpoint { kCompletions, kChatCompletions };

enum class FieldSupport {
  kSupported,  // read and honoured (the parser checks its value)
  kNoEffect,   // accepted, changes nothing Headway answers (e.g. `user`)
  kNotYet,     // an OpenAI or vLLM field Headway does not implement: 400
};

struct RequestField {
  const char* name;
  FieldSupport support;
  bool completions;  // taken by /v1/completions
  bool chat;         // taken by /v1/chat/completions
};

// Every field named in the policy, in README order.
const std::vector<RequestField>& RequestFields();

// The first top-level field of `body` (a JSON object) that `endpoint` does
// not take, as a 400 with param = the field: "'<name>' is not supported
// yet" for kNotYet fields (and fields of the other endpoint), or OpenAI's
// "Unrecognized request argument supplied: <name>" for any other name. A
// field whose value is JSON null counts as absent. nullopt when all are
// taken.
std::optional<ApiError> CheckFieldNames(const nlohmann::json& body, ApiEndpoint endpoint);

}  // namespace headway
