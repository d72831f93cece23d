// Random benchmark prompts, as `vllm bench serve --dataset-name random`
// makes them: a prefix shared by every prompt, then a random part per prompt.
//
// Completions prompts are token-id arrays so that the input length is exact
// without a tokenizer on the client. Chat prompts are text (the chat API
// takes no token ids): random common English words, one word per intended
// token; the server's chat template adds its own tokens, and the benchmark
// reports the prompt length the server counted (usage.prompt_tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace headway::bench {

// Random token ids are drawn uniformly from [kPromptTokenIdBegin,
// kPromptTokenIdEnd): ordinary tokens of SmolLM2's 49152-entry vocabulary
// (and of any Llama-family vocabulary of 40k or more), clear of the special
// and byte tokens at the low end.
inline constexpr int32_t kPromptTokenIdBegin = 1000;
inline constexpr int32_t kPromptTokenIdEnd = 40000;

struct BenchPrompt {
  std::vector<int32_t> token_ids;  // completions: [prefix_len + input_len] ids
  std::string text;                // chat: prefix_len + input_len words
  int prompt_len = 0;              // tokens (or words) the client intended
  int output_len = 0;              // max_tokens
};

// Makes `num_prompts` prompts: the first `prefix_len` ids (or words) are the
// same in every prompt, the next `input_len` are random per prompt. Equal
// arguments give equal prompts (std::mt19937_64 seeded with `seed`).
// REQUIRES: num_prompts >= 0, prefix_len >= 0, input_len >= 0.
std::vector<BenchPrompt> GeneratePrompts(int num_prompts, int prefix_len, int input_len,
                                         int output_len, bool as_text, uint64_t seed);

}  // namespace headway::bench
