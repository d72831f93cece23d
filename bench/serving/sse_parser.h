// SseParser: splits a text/event-stream body into event data payloads.
//
// Follows the WHATWG HTML "server-sent events" parsing rules for the parts an
// OpenAI stream uses: lines end in LF, CRLF or CR; `data:` lines (one
// optional space after the colon) are joined with LF; a blank line dispatches
// the event; comment lines (leading ':') and other fields are ignored.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace headway::bench {

class SseParser {
 public:
  using DataCallback = std::function<void(const std::string& data)>;

  // Consumes the next bytes of the body, which may end anywhere (mid-line,
  // mid-CRLF). Calls `on_data` once per complete event that had data lines,
  // in order. Not thread-safe.
  void Feed(std::string_view bytes, const DataCallback& on_data);

  // True when bytes of an unfinished event are buffered: the stream was
  // cut inside an event.
  bool HasPartialEvent() const { return !line_.empty() || has_data_; }

 private:
  void ProcessLine(const DataCallback& on_data);

  std::string line_;        // the current line so far, without its end
  std::string data_;        // data lines of the current event, joined by LF
  bool has_data_ = false;   // the current event has at least one data line
  bool last_was_cr_ = false;  // a CR ended the last line; skip a following LF
};

}  // namespace headway::bench
