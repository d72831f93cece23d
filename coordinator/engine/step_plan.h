// The step protocol's coordinator side (DESIGN.md "Step protocol"): the
// StepPlan every TP rank of an instance receives for one scheduled batch,
// and the collection of the ranks' StepResults until the step is done.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduling/scheduler.h"
#include "proto/control.pb.h"

namespace headway {

// One StepPlan per TP rank ([tp_size]) for `batch` under `step_id`: every
// scheduled sequence with the tokens of its chunk, its start position,
// sampling parameters, the rows whose logits give prompt logprobs
// (Sequence::PromptLogprobRows) and that rank's block-table deltas, plus the
// sequences the workers must drop first. The ranks' plans differ only in
// their deltas. REQUIRES: every sequence of the batch is in `scheduler`;
// batch deltas have at most tp_size ranks.
std::vector<proto::StepPlan> BuildStepPlans(uint64_t step_id, const ScheduledBatch& batch,
                                            const Scheduler& scheduler, int tp_size);

// A step sent to an instance's ranks, collecting their results.
class InFlightStep {
 public:
  // `sent_at`: when its plans went out.
  InFlightStep(int instance_id, uint64_t step_id, ScheduledBatch batch, int tp_size,
               Clock::time_point sent_at = Clock::now());

  enum class Progress {
    kRejected,  // not this step's result, or a rank that answered already (logged)
    kWaiting,   // accepted; other ranks have yet to answer
    kDone,      // accepted; every rank has answered
  };
  // Takes rank `rank`'s result, received at `now`. REQUIRES: 0 <= rank < tp_size.
  Progress OnResult(int rank, const proto::StepResult& result,
                    Clock::time_point now = Clock::now());

  // When the first rank's result was accepted; nullopt before any.
  const std::optional<Clock::time_point>& first_answer_at() const { return first_answer_at_; }
  // The lowest rank that has not answered; -1 once all have.
  int FirstUnanswered() const;

  uint64_t step_id() const { return step_id_; }
  Clock::time_point sent_at() const { return sent_at_; }
  // The largest StepResult.seconds of the ranks that answered: the slowest
  // rank's own time for the step.
  double worker_seconds() const { return worker_seconds_; }
  const ScheduledBatch& batch() const { return batch_; }
  // Rank 0's sampled tokens (rank 0 samples).
  const std::vector<proto::SampledToken>& tokens() const { return tokens_; }
  // Rank 0's prompt logprobs (SequenceStep.prompt_logprob_token_ids).
  const std::vector<proto::PromptLogprobs>& prompt_logprobs() const { return prompt_logprobs_; }
  // OK, or the first rank error, naming the instance, rank and step.
  const Status& status() const { return status_; }

 private:
  const int instance_id_;
  const uint64_t step_id_;
  ScheduledBatch batch_;
  Clock::time_point sent_at_;
  std::vector<bool> answered_;  // [tp_size]
  std::optional<Clock::time_point> first_answer_at_;
  double worker_seconds_ = 0.0;
  std::vector<proto::SampledToken> tokens_;
  std::vector<proto::PromptLogprobs> prompt_logprobs_;
  Status status_;
};

}  // namespace headway
