#include "coordinator/http/stream_renderer.h"

#include "coordinator/http/api_error.h"
#include "coordinator/http/sse.h"

namespace headway {

using nlohmann::json;

json StreamRenderer::Logprobs(const OutputStream::Update& update) {
  if (!logprobs_ || update.tokens.empty()) return nullptr;
  if (kind_ == StreamKind::kChat) return ChatLogprobsJson(update.tokens, *tokenizer_);
  json out = CompletionLogprobsJson(update.tokens, *tokenizer_, text_offset_);
  text_offset_ += TokensByteLength(update.tokens, *tokenizer_);
  return out;
}

json StreamRenderer::Chunk(const std::string& text, json logprobs, json finish_reason, json stop_reason) {
  if (kind_ == StreamKind::kCompletion) {
    return CompletionChunkJson(header_, text, std::move(logprobs), std::move(finish_reason),
                               std::move(stop_reason), include_usage_);
  }
  json delta = json::object();
  if (!text.empty()) delta["content"] = text;
  return ChatChunkJson(header_, std::move(delta), std::move(logprobs), std::move(finish_reason),
                       std::move(stop_reason), include_usage_);
}

std::string StreamRenderer::Render(const OutputStream::Update& update) {
  if (done_) return "";
  std::string out;
  const bool failed = update.final && !update.final->status.ok();
  if (kind_ == StreamKind::kChat && !sent_role_ && !failed) {
    out += SseEvent(ChatChunkJson(header_, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr,
                                  nullptr, include_usage_));
    sent_role_ = true;
  }
  json logprobs = Logprobs(update);
  if (!update.final) {
    if (!update.text.empty() || !logprobs.is_null()) {
      out += SseEvent(Chunk(update.text, std::move(logprobs), nullptr, nullptr));
    }
    return out;
  }
  done_ = true;
  const CompletionOutcome& outcome = *update.final;
  if (failed) {
    if (!update.text.empty()) out += SseEvent(Chunk(update.text, std::move(logprobs), nullptr, nullptr));
    out += SseEvent(ApiErrorFromStatus(outcome.status).ToJson());
  } else {
    out += SseEvent(Chunk(update.text, std::move(logprobs), FinishReasonName(outcome.finish_reason),
                          StopReasonJson(outcome)));
    if (include_usage_) {
      out += SseEvent(UsageChunkJson(
          header_, kind_ == StreamKind::kChat ? "chat.completion.chunk" : "text_completion", outcome));
    }
  }
  out += kSseDone;
  return out;
}

}  // namespace headway
