// Token sampling from logits: logit processors (logit bias, banned
// tokens, repetition / frequency / presence penalties), then greedy or
// temperature, min-p, top-k, top-p (CPU).
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace headway {

struct SamplingConfig {
  float temperature = 0.0f;  // <= 0: greedy (argmax; lowest id wins a tie)
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;        // in (0, 1]; 1: off
  float min_p = 0.0f;        // in [0, 1]; 0: off
};

// What a request asks to change in its logits before sampling. Defaults
// change nothing.
struct LogitProcessors {
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  std::vector<int32_t> allowed;  // when not empty, every other token id is set to -inf
  std::vector<int32_t> banned;   // token ids set to -inf (stop tokens before min_tokens, bad words)
  // Structured output's token mask: when not empty, token t keeps its logit
  // only if bit (t % 8) of byte t / 8 is set (ids past its end: -inf).
  std::string_view allowed_bitmask;
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float frequency_penalty = 0.0f;   // in [-2, 2]; 0: off
  float presence_penalty = 0.0f;    // in [-2, 2]; 0: off

  bool Penalizes() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
  bool Active() const {
    return !allowed.empty() || !allowed_bitmask.empty() || !logit_bias.empty() ||
           !banned.empty() || Penalizes();
  }
};

// The tokens a sequence has seen, as the penalties read them.
struct TokenHistory {
  std::vector<int32_t> prompt_ids;                 // distinct prompt token ids, any order
  std::unordered_map<int32_t, int32_t> output_counts;  // generated token id -> times generated
};

struct SampleResult {
  int32_t token_id = -1;
  float logprob = 0.0f;  // log softmax of the raw logits (temperature 1), at token_id
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first, raw log softmax
};

// The SplitMix64 finaliser (Steele et al. 2014): a bijective mix of the 64
// bits of x, the same on every platform.
uint64_t SplitMix64(uint64_t x);

// A uniform double in [0, 1) that depends only on (seed, counter): the same
// request with the same seed samples the same tokens however it is batched.
// Built on SplitMix64.
double SeededUniform(uint64_t seed, uint64_t counter);

namespace cpu {

// Applies `processors` to `logits` ([vocab_size] f32) in place, in the order
// of vLLM's v1 sampler (vllm/v1/sample/sampler.py and
// vllm/model_executor/layers/utils.py apply_penalties), before temperature:
//   0. allowed:     l[t] = -inf for every t not listed (when the list is
//                   set) and every t outside allowed_bitmask (when set;
//                   vLLM applies its grammar bitmask before the sampler too)
//   1. logit bias:  l[t] += bias[t]  (ids outside the vocabulary are skipped)
//   2. banned:      l[t] = -inf
//   3. repetition:  for t in the prompt or the output (CTRL, Keskar et al.
//                   2019): l[t] = l[t] > 0 ? l[t] / r : l[t] * r
//   4. frequency:   l[t] -= frequency_penalty * count[t]  (output only)
//   5. presence:    l[t] -= presence_penalty * (count[t] > 0)  (output only)
// (OpenAI's definition of the last two: platform.openai.com/docs/guides/
// text-generation, "frequency and presence penalties".) Cost: O(size of
// the history + bias + banned), and O(vocab) with an allowed list. REQUIRES: the ids in
// `history` lie in [0, vocab_size).
void ApplyLogitProcessors(float* logits, int vocab_size, const LogitProcessors& processors,
                          const TokenHistory& history);

// Sets result->logprob (of result->token_id) and result->top_logprobs (the
// `num_top_logprobs` best, best first, lowest id first on ties) from the
// log softmax of `logits`: the raw logprobs a request gets back whatever
// processors changed the logits it was sampled from, as vLLM returns by
// default. REQUIRES: result->token_id in [0, vocab_size).
void FillLogprobs(const float* logits, int vocab_size, int num_top_logprobs,
                  SampleResult* result);

// Samples one token from `logits` ([vocab_size] f32).
// Order (as in vLLM / Hugging Face): temperature scaling, min-p (drops the
// tokens whose probability at that temperature is below min_p times the
// most likely token's: vLLM's MinPLogitsProcessor, Nguyen et al. 2024),
// top-k, top-p (smallest set of most likely tokens whose probability,
// renormalised over the kept set, reaches top_p; never empty), then
// inverse-CDF sampling with
// `uniform` in [0, 1) over the kept tokens in ascending id order, so a given
// uniform maps to one token whatever the implementation. Greedy ignores
// `uniform`. Ties rank the lower id first (greedy, top-k, top logprobs).
// `num_top_logprobs` best tokens of the raw distribution go to top_logprobs
// (all of them if fewer); kNoLogprobs computes no logprob at all (logprob
// stays 0, top_logprobs empty), which skips the log partition, an exp per
// vocabulary entry. Cost: O(vocab) plus O(top_k log top_k) with top-k;
// a full sort only for top-p without top-k.
// REQUIRES: logits finite or -inf (-inf tokens are never sampled), not all
// -inf. vocab_size <= 0 gives token_id -1.
constexpr int kNoLogprobs = -1;
SampleResult Sample(const float* logits, int vocab_size, const SamplingConfig& config,
                    double uniform, int num_top_logprobs);

}  // namespace cpu
}  // namespace headway
