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

void Sequence::AppendToken(int32_t token_id, Clock::time_point now) {
  output_ids_.push_back(token_id);
  if (!first_token_) first_token_ = now;
}

}  // namespace headway
