// Turns the OutputStream updates of a streaming request's choices into the
// SSE bytes that OpenAI's streaming API sends (vLLM's chunk shapes), each
// chunk naming its choice's index:
//   completions: text_completion chunks with choices[].text deltas; with
//         echo or prompt_logprobs (PromptEcho) a choice's first chunk holds
//         its prompt text, the prompt's logprobs and vLLM's prompt_logprobs;
//   chat: a first chat.completion.chunk with delta {role: "assistant",
//         content: ""}, then (vLLM's echo) the echoed last message, then
//         delta {content} chunks;
// then per choice a chunk with finish_reason (and stop_reason); once all
// have finished, with stream_options.include_usage one more chunk with
// empty choices and the usage of them all, and `data: [DONE]`. A request that fails mid-stream sends
// `data: {"error": {...}}` and then `data: [DONE]`, as vLLM does.
// Not thread-safe: one per streaming response.
#pragma once

#include <string>
#include <vector>

#include "coordinator/http/openai_response.h"
#include "coordinator/engine/request_output.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

enum class StreamKind { kCompletion, kChat };

class StreamRenderer {
 public:
  // `num_choices` choices stream at once (n x prompts; choice i*n+j answers
  // prompt i), each chunk carrying its choice's index. `echo` (completions):
  // the prompts to echo and the prompt logprobs to return; prompt i's
  // logprobs arrive in choice i*n's updates (OutputStream::Update), which
  // the caller renders before the other choices of that prompt. REQUIRES:
  // `tokenizer` outlives the renderer; num_choices >= 1, n >= 1.
  StreamRenderer(StreamKind kind, ResponseHeader header, bool include_usage, bool logprobs,
                 const Tokenizer& tokenizer, int num_choices = 1, int n = 1,
                 PromptEcho echo = {})
      : kind_(kind), header_(std::move(header)), include_usage_(include_usage),
        logprobs_(logprobs), tokenizer_(&tokenizer), n_(n), echo_(std::move(echo)),
        choices_(size_t(num_choices)), outcomes_(size_t(num_choices)),
        prompt_logprobs_(size_t((num_choices + n - 1) / n)) {}

  // The SSE bytes for choice `index`'s `update` (may be empty: nothing new
  // to say). Once every choice's final outcome has been rendered (with the
  // usage chunk when asked), or one choice failed (its error event: the
  // caller cancels the others), done() is true and the bytes end with
  // `data: [DONE]`. Updates after that render nothing.
  std::string Render(int index, const OutputStream::Update& update);
  std::string Render(const OutputStream::Update& update) { return Render(0, update); }

  bool done() const { return done_; }
  // Choice `index`'s final update has been rendered.
  bool finished(int index) const { return choices_.at(size_t(index)).finished; }
  // A choice failed (its error event has been rendered).
  bool failed() const { return failed_; }

 private:
  struct Choice {
    bool sent_role = false;
    bool sent_prompt = false;  // echo / prompt_logprobs chunk
    bool finished = false;
    size_t text_offset = 0;  // completions logprobs text_offset
  };

  nlohmann::json Logprobs(Choice& choice, const OutputStream::Update& update);
  // Choice `index`'s first chunk with echo or prompt_logprobs; "" without.
  std::string PromptChunk(int index, Choice& choice, const OutputStream::Update& update);
  nlohmann::json Chunk(int index, const std::string& text, nlohmann::json logprobs,
                       nlohmann::json finish_reason, nlohmann::json stop_reason);

  const StreamKind kind_;
  const ResponseHeader header_;
  const bool include_usage_;
  const bool logprobs_;
  const Tokenizer* tokenizer_;
  const int n_;
  const PromptEcho echo_;
  std::vector<Choice> choices_;
  std::vector<CompletionOutcome> outcomes_;  // the finished ones', for the usage
  std::vector<std::vector<GeneratedToken>> prompt_logprobs_;  // [prompts], from choice i*n
  int num_finished_ = 0;
  bool done_ = false;
  bool failed_ = false;
};

}  // namespace headway
