// Server-sent events as OpenAI's streaming API uses them
// (https://html.spec.whatwg.org/multipage/server-sent-events.html): each
// event is one `data: <json>` line followed by a blank line, and the stream
// ends with `data: [DONE]`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace headway {

// "data: <compact json>\n\n"; invalid UTF-8 in strings becomes U+FFFD.
std::string SseEvent(const nlohmann::json& data);

// The last event of every stream.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Splits a complete SSE body into the payloads of its `data:` events, in
// order ("[DONE]" included). Comment lines (":...") are skipped. Errors
// (InvalidArgument naming the byte offset): a line that is neither a
// comment nor `data: ...`, an event with several data lines, or a body that
// does not end with a blank line.
Result<std::vector<std::string>> ParseSse(std::string_view body);

}  // namespace headway
