#include "coordinator/scheduling/sequence.h"

#include <algorithm>
#include <string>

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
  if (sampling_.grammar) {
    // The start mask was computed when the grammar was compiled, so this
    // creates no automaton state and cannot fail.
    HW_CHECK(SetGrammarState(sampling_.grammar->start()).ok());
  }
}

Status Sequence::SetGrammarState(int32_t state) {
  structured::TokenAutomaton& g = *sampling_.grammar;
  HW_ASSIGN_OR_RETURN(std::shared_ptr<const structured::TokenMask> mask, g.Mask(state));
  HW_ASSIGN_OR_RETURN(grammar_complete_, g.IsTerminal(state));
  grammar_state_ = state;
  if (!g.IsAccepting(state)) {
    // A pattern that reaches a character class no token can spell (or an
    // empty one) leaves a state with nothing to sample.
    if (structured::MaskAllowsNone(*mask)) {
      return Status::FailedPrecondition("sequence " + std::to_string(seq_id_) +
                                        ": no token of the vocabulary continues its grammar");
    }
    grammar_mask_ = std::move(mask);
    return Status::Ok();
  }
  // A whole valid output may end here: the stop tokens join the mask.
  auto with_stops = std::make_shared<structured::TokenMask>(*mask);
  if (!stop_.ignore_eos) structured::MaskAllow(with_stops.get(), stop_.eos_id);
  for (int32_t id : stop_.stop_token_ids) structured::MaskAllow(with_stops.get(), id);
  grammar_mask_ = std::move(with_stops);
  return Status::Ok();
}

Status Sequence::AdvanceGrammar(int32_t token_id) {
  if (!sampling_.grammar) return Status::Ok();
  const bool stops = (!stop_.ignore_eos && token_id == stop_.eos_id) ||
                     std::find(stop_.stop_token_ids.begin(), stop_.stop_token_ids.end(),
                               token_id) != stop_.stop_token_ids.end();
  if (stops) return Status::Ok();
  HW_ASSIGN_OR_RETURN(const int32_t next, sampling_.grammar->Advance(grammar_state_, token_id));
  if (next == structured::TokenAutomaton::kDead) {
    return Status::Internal("sequence " + std::to_string(seq_id_) + " sampled token " +
                            std::to_string(token_id) + ", which its grammar does not allow");
  }
  return SetGrammarState(next);
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
