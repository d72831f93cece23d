#include "coordinator/scheduling/sequence.h"

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
                   StopConditions stop, Clock::time_point arrival, SequenceKind kind)
    : seq_id_(seq_id),
      prompt_ids_(std::move(prompt_ids)),
      sampling_(std::move(sampling)),
      stop_(std::move(stop)),
      arrival_(arrival),
      kind_(kind) {
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

Sequence::PromptRows Sequence::PromptLogprobRows(int start, int num_tokens) const {
  if (!NeedsPromptLogprobs()) return {};
  // Row q gives position q + 1: the rows are q in [end - 1, L - 1).
  const int from = std::max(start, prompt_logprobs_end_ - 1);
  const int to = std::min(start + num_tokens, num_prompt_tokens() - 1);
  if (to <= from) return {};
  return {from - start, to - from};
}

void Sequence::AdvancePromptLogprobs(int end) {
  HW_CHECK(end >= prompt_logprobs_end_ && end <= num_prompt_tokens());
  prompt_logprobs_end_ = end;
}

void Sequence::AppendToken(int32_t token_id, Clock::time_point now) {
  output_ids_.push_back(token_id);
  if (!first_token_) first_token_ = now;
}

}  // namespace headway
