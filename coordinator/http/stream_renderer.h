// Turns a streaming request's OutputStream updates into the SSE bytes that
// OpenAI's streaming API sends (vLLM's chunk shapes):
//   completions: text_completion chunks with choices[].text deltas;
//   chat: a first chat.completion.chunk with delta {role: "assistant",
//         content: ""}, then delta {content} chunks;
// then a chunk with finish_reason (and stop_reason), with
// stream_options.include_usage one more chunk with empty choices and the
// usage, and `data: [DONE]`. A request that fails mid-stream sends
// `data: {"error": {...}}` and then `data: [DONE]`, as vLLM does.
// Not thread-safe: one per streaming response.
#pragma once

#include <string>

#include "coordinator/http/openai_response.h"
#include "coordinator/engine/request_output.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

enum class StreamKind { kCompletion, kChat };

class StreamRenderer {
 public:
  // REQUIRES: `tokenizer` outlives the renderer.
  StreamRenderer(StreamKind kind, ResponseHeader header, bool include_usage, bool logprobs,
                 const Tokenizer& tokenizer)
      : kind_(kind), header_(std::move(header)), include_usage_(include_usage),
        logprobs_(logprobs), tokenizer_(&tokenizer) {}

  // The SSE bytes for `update` (may be empty: nothing new to say). After
  // the update that carries the final outcome, done() is true and the bytes
  // end with `data: [DONE]`.
  std::string Render(const OutputStream::Update& update);

  bool done() const { return done_; }

 private:
  nlohmann::json Logprobs(const OutputStream::Update& update);
  nlohmann::json Chunk(const std::string& text, nlohmann::json logprobs,
                       nlohmann::json finish_reason, nlohmann::json stop_reason);

  const StreamKind kind_;
  const ResponseHeader header_;
  const bool include_usage_;
  const bool logprobs_;
  const Tokenizer* tokenizer_;
  bool sent_role_ = false;
  bool done_ = false;
  size_t text_offset_ = 0;  // completions logprobs text_offset
};

}  // namespace headway
