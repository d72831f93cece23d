#include "bench/serving/sse_parser.h"

namespace headway::bench {

void SseParser::Feed(std::string_view bytes, const DataCallback& on_data) {
  for (char c : bytes) {
    if (last_was_cr_) {
      last_was_cr_ = false;
      if (c == '\n') continue;
    }
    if (c == '\r' || c == '\n') {
      last_was_cr_ = c == '\r';
      ProcessLine(on_data);
      line_.clear();
    } else {
      line_ += c;
    }
  }
}

void SseParser::ProcessLine(const DataCallback& on_data) {
  if (line_.empty()) {
    if (has_data_) on_data(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] == ':') return;  // comment (keep-alive)
  size_t colon = line_.find(':');
  std::string_view field = std::string_view(line_).substr(0, colon);
  if (field != "data") return;
  std::string_view value;
  if (colon != std::string::npos) {
    value = std::string_view(line_).substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

}  // namespace headway::bench
