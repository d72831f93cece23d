// Token sampling from logits: greedy, temperature, top-k, top-p (CPU).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace headway {

struct SamplingConfig {
  float temperature = 0.0f;  // <= 0: greedy (argmax; lowest id wins a tie)
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;        // in (0, 1]; 1: off
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

// Samples one token from `logits` ([vocab_size] f32).
// Order (as in vLLM / Hugging Face): temperature scaling, top-k, top-p
// (smallest set of most likely tokens whose probability, renormalised over
// the top-k set, reaches top_p; never empty), then inverse-CDF sampling with
// `uniform` in [0, 1) over the kept tokens in ascending id order, so a given
// uniform maps to one token whatever the implementation. Greedy ignores
// `uniform`. Ties rank the lower id first (greedy, top-k, top logprobs).
// `num_top_logprobs` best tokens of the raw distribution go to top_logprobs
// (all of them if fewer). Cost: O(vocab) plus O(top_k log top_k) with top-k;
// a full sort only for top-p without top-k.
// REQUIRES: logits finite or -inf (-inf tokens are never sampled), not all
// -inf. vocab_size <= 0 gives token_id -1.
SampleResult Sample(const float* logits, int vocab_size, const SamplingConfig& config,
                    double uniform, int num_top_logprobs);

}  // namespace cpu
}  // namespace headway
