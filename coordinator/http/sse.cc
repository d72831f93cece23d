#include "coordinator/http/sse.h"

namespace headway {

std::string SseEvent(const nlohmann::json& data) {
  return "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

Result<std::vector<std::string>> ParseSse(std::string_view body) {
  std::vector<std::string> events;
  bool in_event = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string_view::npos) {
      return Status::InvalidArgument("SSE line at byte " + std::to_string(pos) + " is not terminated");
    }
    std::string_view line = body.substr(pos, end - pos);
    if (line.empty()) {
      in_event = false;
    } else if (line[0] == ':') {
      // comment
    } else if (line.rfind("data: ", 0) == 0) {
      if (in_event) {
        return Status::InvalidArgument("SSE event at byte " + std::to_string(pos) +
                                       " has more than one data line");
      }
      events.emplace_back(line.substr(6));
      in_event = true;
    } else {
      return Status::InvalidArgument("SSE line at byte " + std::to_string(pos) +
                                     " is not `data: ...`: " + std::string(line.substr(0, 40)));
    }
    pos = end + 1;
  }
  if (in_event) return Status::InvalidArgument("the SSE body ends inside an event (no blank line)");
  return events;
}

}  // namespace headway
