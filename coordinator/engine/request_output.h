// What a request produces: the whole outcome (CompletionOutcome) and, for a
// streaming request, the OutputStream through which the engine thread hands
// new text to the HTTP thread as tokens are sampled.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduling/sequence.h"

namespace headway {

// One sampled token with its log-probabilities (natural log of the softmax
// of the raw logits, proto SampledToken). logprob and top_logprobs are only
// filled when the request asked for logprobs.
struct GeneratedToken {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
  int rank = 0;  // prompt logprobs only: 1 + tokens with a greater logprob
};

struct CompletionOutcome {
  // Not OK: the request failed (Cancelled: the client went away;
  // ApiErrorFromStatus gives the HTTP answer) and the rest is unset.
  Status status;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;          // the stop string that ended it; "" = none
  int32_t stop_token_id = -1;       // the stop_token_ids entry that ended it; -1 = none
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;
  int num_cached_tokens = 0;        // prompt tokens whose KV the instance's prefix cache held
  int num_transferred_tokens = 0;   // prompt tokens whose KV a transfer brought for it
  std::vector<int32_t> output_ids;
  std::vector<GeneratedToken> tokens;  // [num_output_tokens] when logprobs were asked, else empty
  // With SamplingOptions::prompt_logprobs: prompt tokens 1 .. num_prompt_tokens
  // - 1 with their logprobs (position 0 has none), else empty.
  std::vector<GeneratedToken> prompt_logprobs;
};

// The length of the prefix of `text` that can be sent to a streaming client
// now: all of it except the longest suffix that is a proper prefix of one of
// `stop_strings` (it may yet become a stop string, which is cut from the
// answer). Since stop strings are valid UTF-8, the cut is at a character
// boundary of `text`. Empty stop strings are ignored.
size_t StreamableLength(std::string_view text, const std::vector<std::string>& stop_strings);

// A single-producer (engine thread), single-consumer (HTTP thread) queue of
// a streaming request's output. The producer never blocks beyond a short
// mutex hold: text from a slow consumer accumulates and is taken in one
// piece. Thread-safe.
class OutputStream {
 public:
  // What Take returns: everything produced since the previous Take.
  struct Update {
    std::string text;                     // whole UTF-8 characters, safe from stop strings
    std::vector<GeneratedToken> tokens;   // tokens sampled since the last Update
    // The prompt's logprobs (CompletionOutcome::prompt_logprobs), once, when
    // all are computed: before the first token.
    std::vector<GeneratedToken> prompt_logprobs;
    std::optional<CompletionOutcome> final;  // set once: the request ended
  };

  // Engine thread: appends new text and the token that produced it.
  void Push(std::string_view text, GeneratedToken token);
  // Engine thread: the prompt's logprobs, all of them.
  void PushPromptLogprobs(std::vector<GeneratedToken> prompt_logprobs);

  // Engine thread: the request ended (finished or failed). `final_text` is
  // the text not yet pushed (the rest of the answer after a stop-string cut
  // or a flush). Later pushes are ignored.
  void Close(std::string_view final_text, CompletionOutcome outcome);

  // HTTP thread: waits up to `timeout` for output and takes it. An Update
  // with nothing in it means the wait timed out.
  Update Take(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;      // guarded by mu_
  bool closed_ = false; // guarded by mu_
};

}  // namespace headway
