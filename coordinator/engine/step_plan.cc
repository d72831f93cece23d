#include "coordinator/engine/step_plan.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <memory>
#include <string>

namespace headway {
namespace {

// The per-step part of the logit processors: min-p, the penalties, and the
// tokens banned this step.
void FillLogitProcessors(const ScheduledSeq& s, const Sequence& seq, proto::SamplingParams* sp) {
  const SamplingOptions& o = seq.sampling();
  sp->set_min_p(o.min_p);
  sp->set_repetition_penalty(o.repetition_penalty);
  sp->set_frequency_penalty(o.frequency_penalty);
  sp->set_presence_penalty(o.presence_penalty);
  if (!s.sample) return;
  if (const std::shared_ptr<const structured::TokenMask> mask = seq.GrammarMask()) {
    // Words of 32 token bits, low bit first, are the wire's bytes of 8 on a
    // little-endian host.
    static_assert(std::endian::native == std::endian::little);
    const size_t vocab = size_t(seq.sampling().grammar->vocabulary().size());
    sp->set_allowed_token_bitmask(reinterpret_cast<const char*>(mask->data()), (vocab + 7) / 8);
  }
  // min_tokens: the stop tokens cannot be sampled before it is reached.
  const StopConditions& stop = seq.stop();
  if (seq.num_output_tokens() < stop.min_tokens) {
    if (!stop.ignore_eos && stop.eos_id >= 0) sp->add_banned_token_ids(stop.eos_id);
    for (int32_t id : stop.stop_token_ids) sp->add_banned_token_ids(id);
  }
  // A bad word's last token is banned when the output ends with the rest.
  const std::vector<int32_t>& out = seq.output_ids();
  for (const std::vector<int32_t>& word : o.bad_words_ids) {
    const size_t rest = word.size() - 1;
    if (rest <= out.size() && std::equal(word.begin(), word.end() - 1, out.end() - rest)) {
      sp->add_banned_token_ids(word.back());
    }
  }
}

// What the sampling rank keeps for the sequence's life, sent once when it
// meets the sequence: logit bias, allowed tokens, and for penalties the
// tokens seen so far (it counts what it samples from then on).
void FillSequenceSampling(const Sequence& seq, proto::SequenceStep* step) {
  const SamplingOptions& o = seq.sampling();
  if (!o.logit_bias.empty() || !o.allowed_token_ids.empty()) {
    proto::SequenceProcessors* p = step->mutable_processors();
    for (const auto& [id, bias] : o.logit_bias) {
      proto::LogitBias* b = p->add_logit_bias();
      b->set_token_id(id);
      b->set_bias(bias);
    }
    p->mutable_allowed_token_ids()->Add(o.allowed_token_ids.begin(), o.allowed_token_ids.end());
  }
  if (!o.Penalizes()) return;
  proto::TokenHistory* h = step->mutable_history();
  if (o.repetition_penalty != 1.0f) {
    std::vector<int32_t> distinct = seq.prompt_ids();
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    h->mutable_prompt_token_ids()->Add(distinct.begin(), distinct.end());
  }
  h->mutable_output_token_ids()->Add(seq.output_ids().begin(), seq.output_ids().end());
}

void FillSequenceStep(const ScheduledSeq& s, const Sequence& seq, proto::SequenceStep* step) {
  step->set_seq_id(s.seq_id);
  step->set_is_new(s.is_new);
  for (int p = s.start_pos; p < s.start_pos + s.num_tokens; ++p) {
    step->add_token_ids(seq.TokenAt(p));
  }
  step->set_start_pos(uint32_t(s.start_pos));
  step->set_sample(s.sample);
  proto::SamplingParams* sp = step->mutable_sampling();
  sp->set_temperature(seq.sampling().temperature);
  sp->set_top_p(seq.sampling().top_p);
  sp->set_top_k(seq.sampling().top_k);
  sp->set_has_seed(seq.sampling().seed.has_value());
  sp->set_seed(seq.sampling().seed.value_or(0));
  sp->set_logprobs(seq.sampling().logprobs);
  sp->set_num_logprobs(seq.sampling().num_top_logprobs);
  FillLogitProcessors(s, seq, sp);
  step->set_num_generated(uint32_t(seq.num_output_tokens()));
  const Sequence::PromptRows rows = seq.PromptLogprobRows(s.start_pos, s.num_tokens);
  if (rows.count == 0) return;
  step->set_prompt_logprobs_first_row(uint32_t(rows.first));
  step->set_num_prompt_top_logprobs(seq.sampling().prompt_logprobs);
  // Row q's logits score the token at q + 1.
  for (int q = s.start_pos + rows.first; q < s.start_pos + rows.first + rows.count; ++q) {
    step->add_prompt_logprob_token_ids(seq.TokenAt(q + 1));
  }
}

}  // namespace

std::vector<proto::StepPlan> BuildStepPlans(uint64_t step_id, const ScheduledBatch& batch,
                                            const Scheduler& scheduler, int tp_size) {
  std::vector<proto::StepPlan> plans(static_cast<size_t>(tp_size));
  for (int rank = 0; rank < tp_size; ++rank) {
    proto::StepPlan& plan = plans[size_t(rank)];
    plan.set_step_id(step_id);
    for (uint64_t id : batch.released_seq_ids) plan.add_released_seq_ids(id);
    for (const ScheduledSeq& s : batch.seqs) {
      const Sequence* seq = scheduler.Find(s.seq_id);
      HW_CHECK(seq != nullptr);
      proto::SequenceStep* step = plan.add_seqs();
      FillSequenceStep(s, *seq, step);
      if (rank == 0 && s.is_new) FillSequenceSampling(*seq, step);
      if (size_t(rank) >= s.deltas.size()) continue;
      for (const SlotBlockDelta& d : s.deltas[size_t(rank)]) {
        proto::SlotDelta* pd = step->add_deltas();
        pd->set_slot(uint32_t(d.slot));
        pd->set_first_logical(uint32_t(d.first_logical));
        for (int32_t b : d.appended) pd->add_appended(b);
        for (int32_t i : d.recycled) pd->add_recycled(uint32_t(i));
      }
    }
  }
  return plans;
}

InFlightStep::InFlightStep(int instance_id, uint64_t step_id, ScheduledBatch batch, int tp_size,
                           Clock::time_point sent_at)
    : instance_id_(instance_id),
      step_id_(step_id),
      batch_(std::move(batch)),
      sent_at_(sent_at),
      answered_(size_t(tp_size), false) {}

InFlightStep::Progress InFlightStep::OnResult(int rank, const proto::StepResult& result,
                                              Clock::time_point now) {
  HW_CHECK(rank >= 0 && size_t(rank) < answered_.size());
  if (result.step_id() != step_id_) {
    spdlog::warn("instance {} rank {}: step result for step {} rejected (in flight: {})",
                 instance_id_, rank, result.step_id(), step_id_);
    return Progress::kRejected;
  }
  if (answered_[size_t(rank)]) {
    spdlog::warn("instance {} rank {}: duplicate result for step {} ignored", instance_id_, rank,
                 result.step_id());
    return Progress::kRejected;
  }
  answered_[size_t(rank)] = true;
  if (!first_answer_at_) first_answer_at_ = now;
  worker_seconds_ = std::max(worker_seconds_, result.seconds());
  if (!result.error().empty() && status_.ok()) {
    status_ = Status::Internal("instance " + std::to_string(instance_id_) + " rank " +
                               std::to_string(rank) + " failed step " +
                               std::to_string(result.step_id()) + ": " + result.error());
  }
  if (rank == 0) {
    tokens_.assign(result.tokens().begin(), result.tokens().end());
    prompt_logprobs_.assign(result.prompt_logprobs().begin(), result.prompt_logprobs().end());
  }
  return FirstUnanswered() < 0 ? Progress::kDone : Progress::kWaiting;
}

int InFlightStep::FirstUnanswered() const {
  const auto it = std::find(answered_.begin(), answered_.end(), false);
  return it == answered_.end() ? -1 : int(it - answered_.begin());
}

}  // namespace headway
