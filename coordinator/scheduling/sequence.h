// One request's token sequence as the scheduler and engine see it: prompt
// and output ids, how many positions are computed, sampling and stop
// conditions, status and timing. The output text and the stop decision are
// the OutputProcessor's (output_processor.h).
//
// Positions [0, num_computed) have their KV in the instance's cache. The
// tokens still to compute are [num_computed, num_tokens()): a prefill (or a
// recompute after preemption) has many, a decoding sequence exactly one (its
// last sampled token).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/structured/token_automaton.h"

namespace headway {

using Clock = std::chrono::steady_clock;

// A duration of Clock in seconds, as the metrics take it.
inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Sampling parameters (proto::SamplingParams without the wire).
struct SamplingOptions {
  float temperature = 1.0f;       // 0 = greedy
  float top_p = 1.0f;             // (0, 1]; 1 = off
  int top_k = -1;                 // <= 0 = off
  std::optional<uint64_t> seed;   // per-request RNG seed
  bool logprobs = false;          // return each sampled token's logprob
  int num_top_logprobs = 0;       // top logprobs per sampled token, [0, 20]; needs logprobs
  float min_p = 0.0f;             // [0, 1]; 0 = off
  // Logit processors (kernels/sampling.h LogitProcessors has the formulas).
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  float frequency_penalty = 0.0f;   // [-2, 2]
  float presence_penalty = 0.0f;    // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100])
  std::vector<int32_t> allowed_token_ids;  // when not empty, only these can be sampled
  // Prompt logprobs (vLLM's prompt_logprobs; completions' echo with
  // logprobs): -1 = none, else the logprob of every prompt token after the
  // first with this many top alternatives, [0, 20].
  int prompt_logprobs = -1;
  // Token sequences that must not be generated: the last token of each is
  // banned whenever the output ends with the ones before it (vLLM's bad_words).
  std::vector<std::vector<int32_t>> bad_words_ids;
  // Structured output: every output is a prefix of one the automaton
  // accepts (a per-step token mask); null = unconstrained.
  std::shared_ptr<structured::TokenAutomaton> grammar;

  // True when sampling reads the tokens seen so far (the worker needs them).
  bool Penalizes() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};

struct StopConditions {
  int max_tokens = 16;            // generated tokens, >= 1
  int max_model_len = 0;          // prompt + generated; 0 = no limit
  bool ignore_eos = false;
  int32_t eos_id = -1;            // -1 = the vocabulary has none
  std::vector<std::string> stop_strings;  // in the decoded output text
  std::vector<int32_t> stop_token_ids;    // sampling one of these stops (even with ignore_eos)
  // Before this many tokens are generated nothing stops the sequence but
  // max_model_len: its stop tokens (EOS unless ignore_eos, stop_token_ids)
  // are never sampled, and stop strings are looked for only in the text of
  // the tokens after the min_tokens-th (vLLM's rules).
  int min_tokens = 0;                     // [0, max_tokens]
};

enum class SequenceStatus { kWaiting, kRunning };

// What a sequence is for. A request's sequence computes its prompt and
// samples tokens; a prefill-only sequence computes its prompt and samples
// nothing: the prompt's whole blocks on a prefill instance, which then move
// to a decode instance (disaggregation).
enum class SequenceKind { kGenerate, kPrefillOnly };

// Why generation ended (OpenAI's finish_reason; kAbort for errors).
enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "abort", ""

class Sequence {
 public:
  // REQUIRES: !prompt_ids.empty().
  Sequence(uint64_t seq_id, std::vector<int32_t> prompt_ids, SamplingOptions sampling,
           StopConditions stop, Clock::time_point arrival,
           SequenceKind kind = SequenceKind::kGenerate);

  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  uint64_t seq_id() const { return seq_id_; }
  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  int num_prompt_tokens() const { return static_cast<int>(prompt_ids_.size()); }
  int num_output_tokens() const { return static_cast<int>(output_ids_.size()); }
  int num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  // Token at position `pos` of prompt + output. REQUIRES: pos < num_tokens().
  int32_t TokenAt(int pos) const;

  int num_computed() const { return num_computed_; }
  int num_uncomputed() const { return num_tokens() - num_computed_; }
  // A sequence is decoding when only its last sampled token is uncomputed.
  bool IsDecoding() const { return num_output_tokens() > 0 && num_uncomputed() == 1; }
  // REQUIRES: num_computed() + n <= num_tokens().
  void AdvanceComputed(int n);
  // Forgets every computed position (preemption by recompute): the prompt and
  // output so far are computed again, and the worker sees a new sequence.
  void ResetComputed();

  // Prompt positions [from, to) that a KV transfer wrote into this
  // instance's prefix cache for this sequence (disaggregated prefill);
  // none by default. REQUIRES: 0 <= from <= to.
  void set_received_positions(int from, int to) {
    received_from_ = from;
    received_to_ = to;
  }
  // At admission, the first `hit` prompt positions came from the prefix
  // cache: those inside the received range count as transferred, the rest
  // as cached. REQUIRES: 0 <= hit <= num_prompt_tokens().
  void RecordPrefixHit(int hit) {
    num_transferred_tokens_ = std::clamp(std::min(hit, received_to_) - received_from_, 0, hit);
    num_cached_tokens_ = hit - num_transferred_tokens_;
  }
  // Of the last admission's prefix hit, the positions this instance held
  // before the request (OpenAI usage.prompt_tokens_details.cached_tokens),
  // and those that arrived by KV transfer for it
  // (prompt_tokens_details.transferred_tokens, a Headway extension).
  int num_cached_tokens() const { return num_cached_tokens_; }
  int num_transferred_tokens() const { return num_transferred_tokens_; }

  // ---- prompt logprobs (SamplingOptions::prompt_logprobs) ----------------
  // The logprob of prompt token p (p >= 1) comes from the logits of row
  // p - 1; prompt positions [0, prompt_logprobs_end()) have theirs (position
  // 0 has none, so the end starts at 1). Kept across preemption: what was
  // returned is not computed again.
  int prompt_logprobs_end() const { return prompt_logprobs_end_; }
  // True while the request wants prompt logprobs that are not computed yet;
  // such a sequence computes its prompt without prefix-cache hits, since a
  // cached position has no logits.
  bool NeedsPromptLogprobs() const {
    return sampling_.prompt_logprobs >= 0 && prompt_logprobs_end_ < num_prompt_tokens();
  }
  // The rows of a chunk of `num_tokens` tokens from position `start` whose
  // logits give prompt logprobs not yet computed: rows [first, first +
  // count) of the chunk (row i is position start + i). {0, 0} when none.
  struct PromptRows {
    int first = 0;
    int count = 0;
  };
  PromptRows PromptLogprobRows(int start, int num_tokens) const;
  // Prompt positions up to `end` (exclusive) now have their logprobs.
  // REQUIRES: prompt_logprobs_end() <= end <= num_prompt_tokens().
  void AdvancePromptLogprobs(int end);

  // True once the worker has been told about the sequence (is_new sent).
  bool on_worker() const { return on_worker_; }
  void set_on_worker(bool v) { on_worker_ = v; }

  const SamplingOptions& sampling() const { return sampling_; }
  const StopConditions& stop() const { return stop_; }

  SequenceStatus status() const { return status_; }
  void set_status(SequenceStatus s) { status_ = s; }

  // Appends a sampled token; records the first token's time.
  void AppendToken(int32_t token_id, Clock::time_point now);

  // ---- structured output (SamplingOptions::grammar) ----------------------
  // Moves the grammar past `token_id`, the token about to be appended, and
  // computes the next mask. A stop token (EOS unless ignore_eos, one of
  // stop_token_ids) leaves the grammar where it is: it ends the output.
  // Errors: Internal when the grammar does not allow the token (its mask
  // was not applied); InvalidArgument when the grammar outgrows its
  // automaton (TokenAutomaton::kMaxStates). OK without a grammar.
  Status AdvanceGrammar(int32_t token_id);
  // The tokens that may be sampled next, or null without a grammar: the
  // grammar's mask, plus the stop tokens once the output is a whole valid
  // one. Bit (id % 32) of word id / 32 is token id.
  std::shared_ptr<const structured::TokenMask> GrammarMask() const { return grammar_mask_; }
  // True when the output is complete under the grammar: nothing can follow.
  bool GrammarComplete() const { return grammar_complete_; }

  SequenceKind kind() const { return kind_; }
  // A prefill-only sequence whose prompt is computed: its KV is complete.
  bool IsPrefillDone() const { return kind_ == SequenceKind::kPrefillOnly && num_uncomputed() == 0; }

  Clock::time_point arrival_time() const { return arrival_; }
  std::optional<Clock::time_point> first_token_time() const { return first_token_; }

 private:
  const uint64_t seq_id_;
  const std::vector<int32_t> prompt_ids_;
  const SamplingOptions sampling_;
  const StopConditions stop_;
  const Clock::time_point arrival_;
  const SequenceKind kind_;

  std::vector<int32_t> output_ids_;
  int num_computed_ = 0;
  int num_cached_tokens_ = 0;
  int num_transferred_tokens_ = 0;
  int received_from_ = 0;
  int received_to_ = 0;
  int prompt_logprobs_end_ = 1;
  bool on_worker_ = false;
  SequenceStatus status_ = SequenceStatus::kWaiting;
  std::optional<Clock::time_point> first_token_;
  // Structured output: the automaton state after the output so far, its
  // mask with the stop tokens where they may end it, and whether it is
  // complete.
  Status SetGrammarState(int32_t state);
  int32_t grammar_state_ = 0;
  std::shared_ptr<const structured::TokenMask> grammar_mask_;
  bool grammar_complete_ = false;
};

}  // namespace headway
