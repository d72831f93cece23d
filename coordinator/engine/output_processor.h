// One request's output as its tokens are sampled: the decoded text (kept
// here once), the stop decision and the part of the text a streaming client
// may already be sent.
//
// Stops are checked in vLLM's order: EOS (unless ignore_eos), then
// stop_token_ids, then stop strings (the earliest match in the text wins,
// and the text is cut before it: vLLM does not return the stop string), then
// max_tokens and max_model_len; then a structured output that is complete
// (nothing but a stop token could follow) stops with "stop". A stopping
// token and special tokens (EOS, <|im_end|>, ...) are not part of the text,
// as with vLLM's default skip_special_tokens. Each token's new text is searched for stop strings
// only where a match could end in it, so a request costs time linear in its
// output, not quadratic.
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/engine/request_output.h"
#include "coordinator/scheduling/sequence.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

// The stop decision over a growing text. Separate from detokenizing so that
// it can be tested on plain strings.
class StopChecker {
 public:
  explicit StopChecker(StopConditions stop) : stop_(std::move(stop)) {}

  // True if `token_id` stops the sequence by itself (EOS unless ignore_eos,
  // or one of stop_token_ids); such a token adds no text.
  bool IsStopToken(int32_t token_id) const;

  // The sequence now has `num_output_tokens` output tokens, the last being
  // `token_id`, and `num_tokens` tokens in all; `text` is what that token
  // added to the text. Returns true when the sequence is done, with
  // finish_reason(), stop_string() and stop_token_id() set and text()
  // trimmed at a stop string. REQUIRES: !done().
  bool Append(int32_t token_id, std::string_view text, int num_output_tokens, int num_tokens);

  // Ends the sequence with kStop because its structured output is complete
  // (Sequence::GrammarComplete): nothing but a stop token could follow.
  // REQUIRES: !done().
  void FinishComplete();

  // Adds the text a decoder held back at the end (an incomplete character)
  // when the sequence ended without a stop string. REQUIRES: done().
  void AppendFinal(std::string_view text);

  // The text so far; once done, the whole answer.
  const std::string& text() const { return text_; }
  // Bytes of text() that no stop string can still cut: all of it but the
  // longest suffix that begins one of the stop strings (StreamableLength).
  size_t StreamableLength() const;

  bool done() const { return finish_reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_reason_; }
  // What ended the sequence with kStop other than EOS: the matched stop
  // string (else "") or stop token id (else -1); OpenAI's `stop_reason` as
  // vLLM reports it.
  const std::string& stop_string() const { return stop_string_; }
  int32_t stop_token_id() const { return stop_token_id_; }
  const StopConditions& conditions() const { return stop_; }

 private:
  bool IsEos(int32_t token_id) const;              // and not ignore_eos
  bool IsListedStopToken(int32_t token_id) const;  // one of stop_token_ids
  // The earliest stop string ending in text_[from, ...), cutting text_.
  bool FindStopString(size_t from);

  const StopConditions stop_;
  std::string text_;
  std::string stop_string_;
  int32_t stop_token_id_ = -1;
  FinishReason finish_reason_ = FinishReason::kNone;
};

// A request's output from the tokens sampled for it: text, stop decision,
// log-probabilities when asked, and a streaming request's OutputStream.
class OutputProcessor {
 public:
  // `stream` (null unless streaming) receives text as it becomes safe to
  // send; `logprobs` keeps every GeneratedToken for the outcome;
  // `first_token` (may be null) is set once a token has been sampled.
  // REQUIRES: `tokenizer` outlives the processor.
  OutputProcessor(const Tokenizer& tokenizer, StopConditions stop, bool logprobs,
                  std::shared_ptr<OutputStream> stream,
                  std::shared_ptr<std::atomic<bool>> first_token = nullptr);

  // `seq` has just appended `token.token_id` (Sequence::AppendToken).
  // Decodes it, decides whether the sequence is done (StopChecker::Append)
  // and streams what no stop string can still cut. Once done, text() is the
  // whole answer. REQUIRES: !done().
  bool OnToken(const Sequence& seq, GeneratedToken token);

  // Appends the logprobs of the next prompt tokens (positions after those
  // already appended; SamplingOptions::prompt_logprobs), for the outcome;
  // `complete`: they were the last, and a stream gets them all now.
  void OnPromptLogprobs(std::vector<GeneratedToken> positions, bool complete);
  bool has_prompt_logprobs() const { return !prompt_logprobs_.empty(); }

  // The finished request's outcome: text, finish and stop reasons, counts
  // and ids from `seq`. REQUIRES: done().
  CompletionOutcome Outcome(const Sequence& seq);
  // Text of the answer not yet pushed to the stream (after a stop-string
  // cut or the decoder's flush), for OutputStream::Close.
  std::string Unstreamed() const;
  // A processor for the same request that has seen no token and no prompt
  // logprob yet (same
  // tokenizer, stop conditions, logprobs switch and stream): the request
  // starts again from its prompt.
  std::unique_ptr<OutputProcessor> Restarted() const;

  const StopChecker& stop() const { return checker_; }
  const std::string& text() const { return checker_.text(); }
  bool done() const { return checker_.done(); }
  const std::shared_ptr<OutputStream>& stream() const { return stream_; }
  bool logprobs() const { return logprobs_; }

 private:
  const Tokenizer* tokenizer_;
  StreamDecoder decoder_;
  StopChecker checker_;
  const bool logprobs_;
  std::vector<GeneratedToken> tokens_;  // when logprobs_
  std::vector<GeneratedToken> prompt_logprobs_;
  const std::shared_ptr<OutputStream> stream_;
  const std::shared_ptr<std::atomic<bool>> first_token_;
  size_t num_streamed_ = 0;             // bytes of text() pushed to stream_
};

}  // namespace headway
