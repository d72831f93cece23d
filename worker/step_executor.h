// Runs StepPlans (proto/control.proto) on one TP rank: keeps per-sequence
// state, applies block-table deltas, runs the forward pass and samples.
//
// A step is check-then-commit: the plan is validated and every touched
// sequence's next state is built on the side; only when the whole plan is
// valid does the forward pass run, and only then is the new state committed.
// A rejected plan changes nothing (no sequence, no table, no step id) and its
// StepResult carries the error.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kernels/sampling.h"
#include "proto/control.pb.h"
#include "worker/forward_model.h"
#include "worker/kv_pool.h"
#include "worker/sequence_state.h"

namespace headway {

struct StepExecutorOptions {
  int tp_rank = 0;                 // rank 0 samples and returns tokens
  int max_tokens_per_step = 8192;  // scheduler.max_num_batched_tokens
  int max_num_logprobs = 20;       // most top logprobs a request may ask for
  // Most prompt logprob rows per step; 0 = MaxPromptLogprobRowsPerStep of the
  // model's vocabulary (common/step_limits.h), the bound the coordinator's
  // scheduler keeps to.
  int max_prompt_logprob_rows = 0;
  // Base of the per-sequence seeds used when a request has no seed;
  // nullopt = drawn from std::random_device at construction.
  std::optional<uint64_t> seed_base;
};

// What the sampling rank keeps for one sequence's logit processors: sent
// with is_new (proto SequenceProcessors and TokenHistory), then the tokens
// it samples are counted into `history`.
struct SequenceSampling {
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::vector<int32_t> allowed;
  bool counts = false;   // penalties: count the sampled tokens into `history`
  TokenHistory history;
};

class StepExecutor {
 public:
  // `model` and `pool` must outlive the executor. Not thread-safe.
  StepExecutor(ForwardModel* model, KvPool* pool, const StepExecutorOptions& options);

  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Validates and runs `plan`; returns the result to send (step_id, tp_rank,
  // sampled tokens and prompt logprobs on rank 0). On a rejected plan, `error`
  // holds the reason (Status::ToString), `code` its StatusCode
  // (comm/status_proto.h) and no state changed. Errors:
  //   step_id not greater than the last executed one; a seq listed twice or
  //   both stepped and released; an unknown seq without is_new; is_new for a
  //   seq that exists; no tokens; start_pos != positions already computed;
  //   a token id out of [0, vocab_size); positions past the model's context
  //   length; more tokens than max_tokens_per_step; a bad delta (see
  //   ApplySlotDelta; block ids are bounded by the pool's blocks of the
  //   slot's dtype, KvPool::num_blocks(KvCacheDtype)); a position written or
  //   attended without a block (see CheckBlocksCover); bad sampling parameters; prompt logprob rows outside
  //   the sequence's tokens, with a token id out of range or more than
  //   MaxPromptLogprobRowsPerStep(vocab_size) in the step (common/step_limits.h), or
  //   more logit rows than the model computes at once
  //   (ForwardModel::max_logit_rows).
  // Sequences in released_seq_ids are forgotten after the step (unknown ids
  // are ignored: release is idempotent). A failed forward pass (a TP
  // collective broke) sets `error`, `code` and `fatal`: the executor must not be
  // used again.
  proto::StepResult Execute(const proto::StepPlan& plan);

  // The state of `seq_id`, or nullptr. Valid until the next Execute.
  const SequenceState* FindSequence(uint64_t seq_id) const;
  size_t num_sequences() const { return sequences_.size(); }
  int tp_rank() const { return options_.tp_rank; }
  std::optional<uint64_t> last_step_id() const { return last_step_id_; }

  // Logits of the last successful step's sampled rows, in plan order of the
  // sequences with sample = true: [num_sampled, vocab_size] f32 (empty after
  // a step with prompt logprob rows, whose logits are not kept); rows the
  // model picked on its device (ForwardModel::device_picks) may be unfilled.
  // For tests.
  const std::vector<float>& TEST_last_logits() const { return logits_; }

 private:
  // A validated step: the next state of each sequence of the plan, in order.
  struct StagedStep {
    std::vector<SequenceState> states;
    std::vector<int32_t> token_ids;   // [n_tokens]
    std::vector<int32_t> positions;   // [n_tokens]
    std::vector<int32_t> query_start; // [num_seqs + 1]
    std::vector<int32_t> start_pos;   // [num_seqs]
    // Rows whose logits are computed: one per sampling seq (logit row r
    // for sampled_seqs[r]), then the prompt rows of prompt_seqs in order.
    std::vector<int32_t> logit_rows;
    std::vector<int> sampled_seqs;    // plan index of each sampled row
    std::vector<int> prompt_seqs;     // plan index of each seq with prompt logprob rows
    // What the sequences met this step (is_new) keep for sampling, by seq id.
    std::unordered_map<uint64_t, SequenceSampling> new_sampling;
  };

  Result<StagedStep> Stage(const proto::StepPlan& plan) const;
  Status StageSequence(const proto::SequenceStep& step, SequenceState* next) const;
  Status CheckSampling(const std::string& name, const proto::SamplingParams& p) const;
  // The prompt logprob fields of `step`: rows inside its tokens, token ids
  // in the vocabulary, top logprobs in [0, max_num_logprobs].
  Status CheckPromptLogprobs(const proto::SequenceStep& step) const;
  // What `seq_id` keeps for sampling this step, or nullptr.
  const SequenceSampling* FindSampling(const StagedStep& staged, uint64_t seq_id) const;
  void BuildTables(const StagedStep& staged);
  void Sample(const proto::StepPlan& plan, const StagedStep& staged,
              proto::StepResult* result) const;
  // The prompt logprobs of the staged prompt rows (SequenceStep's
  // prompt_logprob_token_ids), from logits_ after the sampled rows.
  void FillPromptLogprobs(const proto::StepPlan& plan, const StagedStep& staged,
                          proto::StepResult* result) const;

  ForwardModel* const model_;
  KvPool* const pool_;
  const StepExecutorOptions options_;
  const uint64_t seed_base_;
  std::vector<SlotSpec> slot_specs_;  // [num_slots] of this rank

  std::unordered_map<uint64_t, SequenceState> sequences_;
  // What sequences with logit bias, allowed tokens or penalties keep for
  // sampling (TP rank 0 only), apart from SequenceState so that staging a
  // step does not copy it.
  std::unordered_map<uint64_t, SequenceSampling> sampling_;
  std::optional<uint64_t> last_step_id_;

  // Reused across steps.
  std::vector<std::vector<int32_t>> table_ids_;  // [num_layers][num_seqs, n_kv, max_blocks]
  std::vector<LayerBlockTable> tables_;          // [num_layers]
  std::vector<float> logits_;
  std::vector<int32_t> greedy_picks_;  // ForwardBatch::greedy_picks of the last step
};

}  // namespace headway
