#include "coordinator/sequence.h"

#include "common/status.h"

namespace headway {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
  }
  return "";
}

Sequence::Sequence(uint64_t seq_id, std::vector<int32_t> prompt_ids, SamplingOptions sampling,
                   StopConditions stop, Clock::time_point arrival)
    : seq_id_(seq_id),
      prompt_ids_(std::move(prompt_ids)),
      sampling_(std::move(sampling)),
      stop_(std::move(stop)),
      arrival_(arrival) {
  HW_CHECK(!prompt_ids_.empty());
}

int32_t Sequence::TokenAt(int pos) const {
  HW_CHECK(pos >= 0 && pos < num_tokens());
  if (pos < num_prompt_tokens()) return prompt_ids_[pos];
  return output_ids_[pos - num_prompt_tokens()];
}

void Sequence::AdvanceComputed(int n) {
  HW_CHECK(n >= 0 && num_computed_ + n <= num_tokens());
  num_computed_ += n;
}

void Sequence::ResetComputed() {
  num_computed_ = 0;
  on_worker_ = false;
}

void Sequence::AppendToken(int32_t token_id, Clock::time_point now) {
  output_ids_.push_back(token_id);
  if (!first_token_) first_token_ = now;
}

bool Sequence::CheckStop(const std::string& text, Clock::time_point now) {
  output_text_ = text;
  if (output_ids_.empty()) return false;
  int32_t last = output_ids_.back();
  if (!stop_.ignore_eos && stop_.eos_id >= 0 && last == stop_.eos_id) {
    Finish(FinishReason::kStop, now);
    return true;
  }
  for (int32_t id : stop_.stop_token_ids) {
    if (last == id) {
      stop_token_id_ = id;
      Finish(FinishReason::kStop, now);
      return true;
    }
  }
  // The earliest stop string wins, whichever of them it is.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_.stop_strings) {
    if (s.empty()) continue;
    size_t at = text.find(s);
    if (at != std::string::npos && at < cut) {
      cut = at;
      stop_string_ = s;
    }
  }
  if (cut != std::string::npos) {
    output_text_ = text.substr(0, cut);
    Finish(FinishReason::kStop, now);
    return true;
  }
  if (num_output_tokens() >= stop_.max_tokens ||
      (stop_.max_model_len > 0 && num_tokens() >= stop_.max_model_len)) {
    Finish(FinishReason::kLength, now);
    return true;
  }
  return false;
}

void Sequence::Finish(FinishReason reason, Clock::time_point now) {
  if (status_ == SequenceStatus::kFinished) return;
  status_ = SequenceStatus::kFinished;
  finish_reason_ = reason;
  finish_ = now;
}

}  // namespace headway
