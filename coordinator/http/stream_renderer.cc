#include "coordinator/http/stream_renderer.h"

#include "common/status.h"
#include "coordinator/http/api_error.h"
#include "coordinator/http/sse.h"

namespace headway {

using nlohmann::json;

json StreamRenderer::Logprobs(Choice& choice, const OutputStream::Update& update) {
  if (!logprobs_ || update.tokens.empty()) return nullptr;
  if (kind_ == StreamKind::kChat) return ChatLogprobsJson(update.tokens, *tokenizer_);
  json out = CompletionLogprobsJson(update.tokens, *tokenizer_, choice.text_offset);
  choice.text_offset += TokensTextLength(update.tokens, *tokenizer_);
  return out;
}

json StreamRenderer::Chunk(int index, const std::string& text, json logprobs, json finish_reason,
                           json stop_reason) {
  if (kind_ == StreamKind::kCompletion) {
    return CompletionChunkJson(header_, index, text, std::move(logprobs), std::move(finish_reason),
                               std::move(stop_reason), include_usage_);
  }
  json delta = json::object();
  if (!text.empty()) delta["content"] = text;
  return ChatChunkJson(header_, index, std::move(delta), std::move(logprobs),
                       std::move(finish_reason), std::move(stop_reason), include_usage_);
}

std::string StreamRenderer::PromptChunk(int index, Choice& choice,
                                        const OutputStream::Update& update) {
  const bool echo = echo_.echo;
  if (choice.sent_prompt) return "";
  if (kind_ == StreamKind::kChat) {  // vLLM's chat echo: the text alone
    choice.sent_prompt = true;
    if (!echo || echo_.texts.front().empty()) return "";
    return SseEvent(Chunk(index, echo_.texts.front(), nullptr, nullptr, nullptr));
  }
  const bool wants_logprobs = (echo && logprobs_) || echo_.prompt_logprobs >= 0;
  if (!echo && !wants_logprobs) return "";
  const size_t prompt = size_t(index / n_);
  if (index % n_ == 0) {
    // Pushed before the first token; a request that fails first has none.
    if (wants_logprobs && update.prompt_logprobs.empty() && !update.final) return "";
    prompt_logprobs_[prompt] = update.prompt_logprobs;
  }
  choice.sent_prompt = true;
  const std::vector<GeneratedToken>& prompt_lp = prompt_logprobs_[prompt];
  json logprobs = nullptr;
  if (echo && logprobs_) {
    logprobs = EchoLogprobsJson(echo_.first_token_ids[prompt], prompt_lp, {}, *tokenizer_);
    choice.text_offset = TextLength(tokenizer_->TokenBytes(echo_.first_token_ids[prompt])) +
                         TokensTextLength(prompt_lp, *tokenizer_);
  }
  json chunk = Chunk(index, echo ? echo_.texts[prompt] : "", std::move(logprobs), nullptr, nullptr);
  if (echo_.prompt_logprobs >= 0) {
    chunk["choices"][0]["prompt_logprobs"] =
        PromptLogprobsJson(prompt_lp, echo_.prompt_logprobs, *tokenizer_);
  }
  return SseEvent(chunk);
}

std::string StreamRenderer::Render(int index, const OutputStream::Update& update) {
  HW_CHECK(index >= 0 && size_t(index) < choices_.size());
  Choice& choice = choices_[size_t(index)];
  if (done_ || choice.finished) return "";
  std::string out;
  const bool failed = update.final && !update.final->status.ok();
  if (kind_ == StreamKind::kChat && !choice.sent_role && !failed) {
    out += SseEvent(ChatChunkJson(header_, index, {{"role", "assistant"}, {"content", ""}}, nullptr,
                                  nullptr, nullptr, include_usage_));
    choice.sent_role = true;
  }
  if (!failed) out += PromptChunk(index, choice, update);
  json logprobs = Logprobs(choice, update);
  if (!update.final) {
    if (!update.text.empty() || !logprobs.is_null()) {
      out += SseEvent(Chunk(index, update.text, std::move(logprobs), nullptr, nullptr));
    }
    return out;
  }
  choice.finished = true;
  const CompletionOutcome& outcome = *update.final;
  if (failed) {
    if (!update.text.empty()) {
      out += SseEvent(Chunk(index, update.text, std::move(logprobs), nullptr, nullptr));
    }
    out += SseEvent(ApiErrorFromStatus(outcome.status).ToJson());
    done_ = true;
    failed_ = true;
    out += kSseDone;
    return out;
  }
  out += SseEvent(Chunk(index, update.text, std::move(logprobs),
                        FinishReasonName(outcome.finish_reason), StopReasonJson(outcome)));
  outcomes_[size_t(index)] = outcome;
  if (++num_finished_ < int(choices_.size())) return out;
  if (include_usage_) {
    out += SseEvent(UsageChunkJson(header_,
                                   kind_ == StreamKind::kChat ? "chat.completion.chunk"
                                                              : "text_completion",
                                   UsageJson(outcomes_, n_)));
  }
  done_ = true;
  out += kSseDone;
  return out;
}

}  // namespace headway
