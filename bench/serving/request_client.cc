#include "bench/serving/request_client.h"

#include <httplib.h>

#include <chrono>
#include <optional>

#include "bench/serving/sse_parser.h"

namespace headway::bench {
namespace {

using nlohmann::json;

// An error body longer than this is cut: it only feeds a message.
constexpr size_t kMaxErrorBodyBytes = 4096;

// The message of an OpenAI `error` value: {"message": ...} or a string.
std::string ErrorDetail(const json& error) {
  if (error.is_object() && error.contains("message") && error["message"].is_string()) {
    return error["message"].get<std::string>();
  }
  if (error.is_string()) return error.get<std::string>();
  return error.dump();
}

// "HTTP 400: <error.message>" from an OpenAI error body, or the raw body.
std::string HttpErrorMessage(int status, const std::string& body) {
  std::string detail = body;
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("error")) detail = ErrorDetail(parsed["error"]);
  return "HTTP " + std::to_string(status) + (detail.empty() ? "" : ": " + detail);
}

// The content of one chunk: choices[0].text (completions) or
// choices[0].delta.content (chat); empty when absent or null.
std::string ChunkContent(const json& chunk, bool chat) {
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty()) return "";
  const json& choice = (*choices)[0];
  if (!choice.is_object()) return "";
  const json* holder = &choice;
  if (chat) {
    auto delta = choice.find("delta");
    if (delta == choice.end() || !delta->is_object()) return "";
    holder = &*delta;
  }
  auto content = holder->find(chat ? "content" : "text");
  if (content == holder->end() || !content->is_string()) return "";
  return content->get<std::string>();
}

// Reads the stream's events into `out`; keeps the per-request state between
// network reads.
class StreamReader {
 public:
  StreamReader(bool chat, double send_s, RequestOutput* out) : chat_(chat), send_s_(send_s), out_(out) {}

  // Returns false (and sets error_) to stop reading.
  bool OnBytes(const char* data, size_t size) {
    parser_.Feed(std::string_view(data, size), [this](const std::string& event) { OnEvent(event); });
    return error_.empty();
  }

  bool done() const { return done_; }
  const std::string& error() const { return error_; }
  int content_chunks() const { return content_chunks_; }
  std::optional<int> usage_completion_tokens() const { return usage_completion_tokens_; }
  std::optional<int> usage_prompt_tokens() const { return usage_prompt_tokens_; }

 private:
  void OnEvent(const std::string& event) {
    if (done_ || !error_.empty()) return;
    if (event == "[DONE]") {
      done_ = true;
      return;
    }
    double now_s = NowSeconds();
    json chunk = json::parse(event, nullptr, /*allow_exceptions=*/false);
    if (!chunk.is_object()) {
      error_ = "malformed stream chunk: " + event.substr(0, 200);
      return;
    }
    if (auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
      error_ = "error event in stream: " + ErrorDetail(*error);
      return;
    }
    auto usage = chunk.find("usage");
    if (usage != chunk.end() && usage->is_object()) {
      auto completion = usage->find("completion_tokens");
      if (completion != usage->end() && completion->is_number_integer()) {
        usage_completion_tokens_ = completion->get<int>();
      }
      auto prompt = usage->find("prompt_tokens");
      if (prompt != usage->end() && prompt->is_number_integer()) {
        usage_prompt_tokens_ = prompt->get<int>();
      }
    }
    std::string content = ChunkContent(chunk, chat_);
    if (content.empty()) return;
    if (content_chunks_ == 0) {
      out_->ttft_s = now_s - send_s_;
    } else {
      out_->itl_s.push_back(now_s - last_content_s_);
    }
    last_content_s_ = now_s;
    out_->latency_s = now_s - send_s_;
    out_->generated_text += content;
    ++content_chunks_;
  }

  const bool chat_;
  const double send_s_;
  RequestOutput* const out_;
  SseParser parser_;
  bool done_ = false;
  std::string error_;
  int content_chunks_ = 0;
  double last_content_s_ = 0;
  std::optional<int> usage_completion_tokens_;
  std::optional<int> usage_prompt_tokens_;
};

}  // namespace

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

json BuildRequestBody(const RequestTarget& target, const BenchPrompt& prompt) {
  json body = {
      {"model", target.model},
      {"max_tokens", prompt.output_len},
      {"temperature", 0.0},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"ignore_eos", target.ignore_eos},
  };
  if (target.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt.text}}});
  } else {
    body["prompt"] = prompt.token_ids;
  }
  return body;
}

RequestOutput SendStreamingRequest(const RequestTarget& target, const BenchPrompt& prompt,
                                   double run_start_s) {
  RequestOutput out;
  out.prompt_len = prompt.prompt_len;

  httplib::Client client(target.scheme_host_port);
  auto timeout = std::chrono::duration<double>(target.timeout_s);
  auto timeout_us = std::chrono::duration_cast<std::chrono::microseconds>(timeout);
  client.set_connection_timeout(timeout_us);
  client.set_read_timeout(timeout_us);
  client.set_write_timeout(timeout_us);

  httplib::Request request;
  request.method = "POST";
  request.path = target.path;
  request.body = BuildRequestBody(target, prompt).dump();
  request.set_header("Content-Type", "application/json");
  request.set_header("Accept", "text/event-stream");
  if (!target.api_key.empty()) request.set_header("Authorization", "Bearer " + target.api_key);

  int status = -1;
  std::string error_body;
  double send_s = NowSeconds();
  out.start_s = send_s - run_start_s;
  StreamReader reader(target.chat, send_s, &out);
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      size_t room = kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, error_body.size());
      error_body.append(data, std::min(size, room));
      return true;
    }
    return reader.OnBytes(data, size);
  };

  httplib::Result result = client.send(request);
  if (status != -1 && status != 200) {
    out.error = HttpErrorMessage(status, error_body);
  } else if (!reader.error().empty()) {
    out.error = reader.error();
  } else if (!result) {
    out.error = "request failed: " + httplib::to_string(result.error());
  } else if (!reader.done()) {
    out.error = "stream ended before data: [DONE]";
  } else if (reader.content_chunks() == 0) {
    out.error = "stream carried no content";
  }
  if (!out.error.empty()) {
    out.ttft_s = 0;
    out.latency_s = 0;
    out.itl_s.clear();
    return out;
  }
  out.success = true;
  out.output_tokens = reader.usage_completion_tokens().value_or(reader.content_chunks());
  if (reader.usage_prompt_tokens()) out.prompt_len = *reader.usage_prompt_tokens();
  return out;
}

}  // namespace headway::bench
