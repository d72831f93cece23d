// The JSON bodies of OpenAI's completion and chat completion responses and
// of their streamed chunks (the shapes vLLM returns), built from an
// engine's CompletionOutcome. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/engine/request_output.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

// Fields every response and chunk of one request repeats.
struct ResponseHeader {
  std::string id;        // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;   // Unix seconds
  std::string model;
};

// {"prompt_tokens", "completion_tokens", "total_tokens",
//  "prompt_tokens_details": {"cached_tokens", "transferred_tokens"}}:
// cached_tokens as OpenAI's (the prompt tokens the serving instance's
// prefix cache held); transferred_tokens, Headway's own, those whose KV a
// prefill instance computed and sent for this request (disaggregation).
// cached + transferred <= prompt_tokens. Over a request's choices (choice
// i*n+j answers prompt i): each prompt counts once, with the cached and
// transferred tokens of its first choice (the others found its blocks in
// the prefix cache); every choice's completion tokens count. REQUIRES: n >= 1.
nlohmann::json UsageJson(const std::vector<CompletionOutcome>& choices, int n);

// vLLM's stop_reason: the stop string, the stop token id, or null.
nlohmann::json StopReasonJson(const CompletionOutcome& outcome);

// Legacy completions logprobs of `tokens`: {"tokens", "token_logprobs",
// "top_logprobs": [{token text: logprob}], "text_offset"}; each top_logprobs
// entry holds the token's top alternatives and the token itself, as
// OpenAI's (up to k + 1 entries). Offsets count characters (Unicode code
// points, as OpenAI's and vLLM's) from `first_offset`, over the tokens'
// texts: a byte-level token that holds part of a character counts it when
// it holds its first byte. Token texts are the tokens' bytes (invalid UTF-8
// is replaced when serialised).
nlohmann::json CompletionLogprobsJson(const std::vector<GeneratedToken>& tokens,
                                      const Tokenizer& tokenizer, size_t first_offset);

// Chat logprobs: {"content": [{"token", "logprob", "bytes",
// "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
nlohmann::json ChatLogprobsJson(const std::vector<GeneratedToken>& tokens,
                                const Tokenizer& tokenizer);

// Characters of `bytes` as text_offset counts them: the bytes that do not
// continue a UTF-8 character.
size_t TextLength(std::string_view bytes);
// TextLength of the tokens' texts together (advances text_offset).
size_t TokensTextLength(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer);

// What a completions response repeats of its prompts (echo) and the
// prompt logprobs it returns. The prompt logprobs of prompt i are those of
// its first choice (CompletionOutcome::prompt_logprobs of choice i * n); its
// other choices computed none.
struct PromptEcho {
  bool echo = false;                     // each choice's text starts with its prompt's
  std::vector<std::string> texts;        // [prompts] when echo: the prompt as sent (ids decoded)
  std::vector<int32_t> first_token_ids;  // [prompts]: token 0 of each prompt
  int prompt_logprobs = -1;              // vLLM's prompt_logprobs field; -1 = absent
};

// Legacy completions logprobs of an echoed prompt followed by the
// generated `tokens`: prompt token 0 (`first_token_id`) with null logprob
// and top_logprobs, the prompt's other tokens (`prompt`), then `tokens`;
// text_offset from 0 over the token texts.
nlohmann::json EchoLogprobsJson(int32_t first_token_id, const std::vector<GeneratedToken>& prompt,
                                const std::vector<GeneratedToken>& tokens,
                                const Tokenizer& tokenizer);

// vLLM's prompt_logprobs of one prompt: [null, then per token 1 ..: {"<token
// id>": {"logprob", "rank", "decoded_token"}} for the prompt token and its
// `num_top` best alternatives (ranks 1 ..)].
nlohmann::json PromptLogprobsJson(const std::vector<GeneratedToken>& prompt, int num_top,
                                  const Tokenizer& tokenizer);

// object "text_completion", a choice per outcome (index i: choices[i],
// which answers prompt i / n) with its whole text; usage as UsageJson.
// `echo` (may be null) prepends the prompt to text and logprobs and adds
// prompt_logprobs to each choice.
nlohmann::json CompletionResponseJson(const ResponseHeader& header,
                                      const std::vector<CompletionOutcome>& choices, int n,
                                      const Tokenizer& tokenizer, bool logprobs,
                                      const PromptEcho* echo = nullptr);

// object "chat.completion", a choice per outcome with message {role:
// assistant, content}; every choice answers the one prompt. With
// `prompt_logprobs` >= 0 (vLLM's field) the response has vLLM's top-level
// prompt_logprobs (PromptLogprobsJson) from the first choice.
// `echo_text` (vLLM's chat echo) starts every choice's content; its
// logprobs cover the generated tokens only.
nlohmann::json ChatResponseJson(const ResponseHeader& header,
                                const std::vector<CompletionOutcome>& choices,
                                const Tokenizer& tokenizer, bool logprobs,
                                int prompt_logprobs = -1, const std::string& echo_text = "");

// A streamed chunk of a completion: object "text_completion", choices
// [{index, text, logprobs, finish_reason, stop_reason}]. `logprobs` and
// `finish` may be null. With include_usage every chunk carries usage: null.
nlohmann::json CompletionChunkJson(const ResponseHeader& header, int index,
                                   const std::string& text, nlohmann::json logprobs,
                                   nlohmann::json finish_reason, nlohmann::json stop_reason,
                                   bool include_usage);

// A streamed chunk of a chat completion: object "chat.completion.chunk",
// choices [{index, delta, logprobs, finish_reason, stop_reason}].
nlohmann::json ChatChunkJson(const ResponseHeader& header, int index, nlohmann::json delta,
                             nlohmann::json logprobs, nlohmann::json finish_reason,
                             nlohmann::json stop_reason, bool include_usage);

// The extra chunk of stream_options.include_usage: `object`, choices [] and
// `usage` (UsageJson).
nlohmann::json UsageChunkJson(const ResponseHeader& header, const char* object,
                              nlohmann::json usage);

}  // namespace headway
