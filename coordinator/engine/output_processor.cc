#include "coordinator/engine/output_processor.h"

#include <algorithm>

#include "common/status.h"
#include "coordinator/engine/request_output.h"

namespace headway {

bool StopChecker::IsEos(int32_t token_id) const {
  return !stop_.ignore_eos && stop_.eos_id >= 0 && token_id == stop_.eos_id;
}

bool StopChecker::IsListedStopToken(int32_t token_id) const {
  return std::find(stop_.stop_token_ids.begin(), stop_.stop_token_ids.end(), token_id) !=
         stop_.stop_token_ids.end();
}

bool StopChecker::IsStopToken(int32_t token_id) const {
  return IsEos(token_id) || IsListedStopToken(token_id);
}

bool StopChecker::Append(int32_t token_id, std::string_view text, int num_output_tokens,
                         int num_tokens) {
  HW_CHECK(!done());
  const size_t old_size = text_.size();
  text_.append(text);
  // vLLM's rules: stop tokens count from the min_tokens-th token on, stop
  // strings only in the text of tokens after it.
  const bool before_min = num_output_tokens < stop_.min_tokens;
  if (before_min) {
    if (stop_.max_model_len > 0 && num_tokens >= stop_.max_model_len) {
      finish_reason_ = FinishReason::kLength;
      return true;
    }
    return false;
  }
  if (IsStopToken(token_id)) {
    // EOS is not a stop_reason (vLLM reports none for it), a listed one is.
    if (!IsEos(token_id)) stop_token_id_ = token_id;
    finish_reason_ = FinishReason::kStop;
    return true;
  }
  const bool past_min = stop_.min_tokens == 0 || num_output_tokens > stop_.min_tokens;
  if (!text.empty() && past_min && FindStopString(old_size)) return true;
  if (num_output_tokens >= stop_.max_tokens ||
      (stop_.max_model_len > 0 && num_tokens >= stop_.max_model_len)) {
    finish_reason_ = FinishReason::kLength;
    return true;
  }
  return false;
}

bool StopChecker::FindStopString(size_t from) {
  // No match ended before `from` (it would have stopped the sequence), so a
  // match now ends in the new text and starts at most |s| - 1 bytes before
  // it; the earliest such start is the earliest match in the whole text.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_.stop_strings) {
    if (s.empty()) continue;
    const size_t begin = from >= s.size() - 1 ? from - (s.size() - 1) : 0;
    const size_t at = text_.find(s, begin);
    if (at != std::string::npos && at < cut) {
      cut = at;
      stop_string_ = s;
    }
  }
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  finish_reason_ = FinishReason::kStop;
  return true;
}

void StopChecker::FinishComplete() {
  HW_CHECK(!done());
  finish_reason_ = FinishReason::kStop;
}

void StopChecker::AppendFinal(std::string_view text) {
  HW_CHECK(done());
  text_.append(text);
}

size_t StopChecker::StreamableLength() const {
  return headway::StreamableLength(text_, stop_.stop_strings);
}

OutputProcessor::OutputProcessor(const Tokenizer& tokenizer, StopConditions stop, bool logprobs,
                                 std::shared_ptr<OutputStream> stream,
                                 std::shared_ptr<std::atomic<bool>> first_token)
    : tokenizer_(&tokenizer),
      decoder_(tokenizer),
      checker_(std::move(stop)),
      logprobs_(logprobs),
      stream_(std::move(stream)),
      first_token_(std::move(first_token)) {}

std::unique_ptr<OutputProcessor> OutputProcessor::Restarted() const {
  return std::make_unique<OutputProcessor>(*tokenizer_, checker_.conditions(), logprobs_, stream_,
                                           first_token_);
}

bool OutputProcessor::OnToken(const Sequence& seq, GeneratedToken token) {
  if (first_token_) first_token_->store(true, std::memory_order_release);
  const int32_t token_id = token.token_id;
  std::string piece;
  if (!checker_.IsStopToken(token_id) && !tokenizer_->IsSpecial(token_id)) {
    piece = decoder_.Push(token_id);
  }
  if (logprobs_) tokens_.push_back(token);
  bool done = checker_.Append(token_id, piece, seq.num_output_tokens(), seq.num_tokens());
  if (!done && seq.GrammarComplete()) {
    checker_.FinishComplete();
    done = true;
  }
  if (stream_) {
    // Stream what no stop string can cut; the rest goes out at the end.
    const size_t safe = done ? num_streamed_ : std::max(checker_.StreamableLength(), num_streamed_);
    stream_->Push(std::string_view(checker_.text()).substr(num_streamed_, safe - num_streamed_),
                  std::move(token));
    num_streamed_ = safe;
  }
  if (!done) return false;
  // A stop string cuts the text; otherwise what the decoder held back (an
  // incomplete character at the very end) is part of the answer.
  if (checker_.stop_string().empty()) checker_.AppendFinal(decoder_.Flush());
  return true;
}

CompletionOutcome OutputProcessor::Outcome(const Sequence& seq) {
  HW_CHECK(done());
  CompletionOutcome out;
  out.text = checker_.text();
  out.finish_reason = checker_.finish_reason();
  out.stop_reason = checker_.stop_string();
  out.stop_token_id = checker_.stop_token_id();
  out.num_prompt_tokens = seq.num_prompt_tokens();
  out.num_output_tokens = seq.num_output_tokens();
  out.num_cached_tokens = seq.num_cached_tokens();
  out.num_transferred_tokens = seq.num_transferred_tokens();
  out.output_ids = seq.output_ids();
  out.tokens = std::move(tokens_);
  out.prompt_logprobs = std::move(prompt_logprobs_);
  return out;
}

void OutputProcessor::OnPromptLogprobs(std::vector<GeneratedToken> positions, bool complete) {
  for (GeneratedToken& t : positions) prompt_logprobs_.push_back(std::move(t));
  // Only whole: a request that moves to another instance before its first
  // token computes them again, and its client must see them once.
  if (complete && stream_) stream_->PushPromptLogprobs(prompt_logprobs_);
}

std::string OutputProcessor::Unstreamed() const {
  const std::string& text = checker_.text();
  return num_streamed_ < text.size() ? text.substr(num_streamed_) : std::string();
}

}  // namespace headway
