#include "coordinator/engine/request_table.h"

namespace headway {
namespace {

// The token as the OutputProcessor takes it: log-probabilities only when
// the request asked for them.
GeneratedToken TokenOf(const proto::SampledToken& sampled, bool logprobs) {
  GeneratedToken token;
  token.token_id = sampled.token_id();
  if (logprobs) {
    token.logprob = sampled.logprob();
    for (const proto::TopLogprob& t : sampled.top_logprobs()) {
      token.top_logprobs.emplace_back(t.token_id(), t.logprob());
    }
    token.rank = sampled.rank();
  }
  return token;
}

}  // namespace

RequestTable::RequestTable(ServingMetrics* metrics) : metrics_(metrics) {}

void RequestTable::Add(uint64_t id, int instance_id, Clock::time_point deadline,
                       std::promise<CompletionOutcome> promise,
                       std::unique_ptr<OutputProcessor> output) {
  HW_CHECK(output != nullptr && !Contains(id));
  ActiveRequest rs;
  rs.instance = instance_id;
  rs.deadline = deadline;
  rs.promise = std::move(promise);
  rs.output = std::move(output);
  requests_.emplace(id, std::move(rs));
}

void RequestTable::Refuse(std::promise<CompletionOutcome> promise,
                          std::shared_ptr<OutputStream> stream, Status status) {
  CompletionOutcome out;
  out.status = std::move(status);
  answers_.push_back(Answer{std::move(promise), std::move(out), std::move(stream), ""});
}

std::optional<int> RequestTable::InstanceOf(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  return it->second.instance;
}

std::vector<uint64_t> RequestTable::OnInstance(int instance_id) const {
  std::vector<uint64_t> ids;
  for (const auto& [id, rs] : requests_) {
    if (rs.instance == instance_id) ids.push_back(id);
  }
  return ids;
}

std::vector<uint64_t> RequestTable::Expired(Clock::time_point now) const {
  std::vector<uint64_t> ids;
  for (const auto& [id, rs] : requests_) {
    if (now >= rs.deadline) ids.push_back(id);
  }
  return ids;
}

std::vector<uint64_t> RequestTable::Ids() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, rs] : requests_) ids.push_back(id);
  return ids;
}

void RequestTable::RecordScheduled(int instance_id, const ScheduledBatch& batch,
                                   const Scheduler& scheduler, Clock::time_point now) {
  for (const ScheduledSeq& s : batch.seqs) {
    auto it = requests_.find(s.seq_id);
    if (it == requests_.end() || it->second.scheduled) continue;
    it->second.scheduled = true;
    metrics_->OnScheduled(instance_id, Seconds(now - scheduler.Find(s.seq_id)->arrival_time()));
  }
}

void RequestTable::JoinedDecode(uint64_t id, int instance_id, Clock::time_point now) {
  ActiveRequest& rs = requests_.at(id);
  rs.instance = instance_id;
  rs.joined_decode = now;
}

bool RequestTable::OnSampled(int instance_id, Sequence& seq, const proto::SampledToken& sampled) {
  const Clock::time_point now = Clock::now();
  ActiveRequest& rs = requests_.at(seq.seq_id());
  seq.AppendToken(sampled.token_id(), now);
  if (!rs.first_token) {
    rs.first_token = true;
    metrics_->OnFirstToken(instance_id, Seconds(now - seq.arrival_time()));
    if (rs.joined_decode) metrics_->OnPdFirstDecode(Seconds(now - *rs.joined_decode));
  } else {
    metrics_->OnToken(instance_id, Seconds(now - rs.last_token_time));
  }
  rs.last_token_time = now;
  return rs.output->OnToken(seq, TokenOf(sampled, rs.output->logprobs()));
}

void RequestTable::OnPromptLogprobs(uint64_t id, const proto::PromptLogprobs& logprobs,
                                    bool complete) {
  std::vector<GeneratedToken> positions;
  for (const proto::SampledToken& t : logprobs.positions()) positions.push_back(TokenOf(t, true));
  requests_.at(id).output->OnPromptLogprobs(std::move(positions), complete);
}

void RequestTable::MovedTo(uint64_t id, int instance_id) {
  ActiveRequest& rs = requests_.at(id);
  rs.instance = instance_id;
  // The new sequence computes its prompt logprobs again too.
  if (rs.first_token || rs.output->has_prompt_logprobs()) rs.output = rs.output->Restarted();
}

void RequestTable::End(uint64_t id, int instance_id, std::unique_ptr<Sequence> seq,
                       Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  ActiveRequest& rs = it->second;
  const bool cancelled = status.code() == StatusCode::kCancelled;  // the client went away
  CompletionOutcome out;
  std::string unstreamed;
  if (status.ok()) {
    HW_CHECK(seq != nullptr);
    out = rs.output->Outcome(*seq);
    unstreamed = rs.output->Unstreamed();
  } else {
    out.status = std::move(status);
  }
  if (seq != nullptr && (out.status.ok() || cancelled)) {
    metrics_->OnFinished(instance_id, cancelled ? FinishReason::kAbort : out.finish_reason,
                         Seconds(Clock::now() - seq->arrival_time()), seq->num_prompt_tokens(),
                         seq->num_output_tokens());
  }
  answers_.push_back(
      Answer{std::move(rs.promise), std::move(out), rs.output->stream(), std::move(unstreamed)});
  requests_.erase(it);
}

void RequestTable::AnswerEnded() {
  for (Answer& a : answers_) {
    if (a.stream) a.stream->Close(a.unstreamed_text, a.outcome);
    a.promise.set_value(std::move(a.outcome));
  }
  answers_.clear();
}

}  // namespace headway
