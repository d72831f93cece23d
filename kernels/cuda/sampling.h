// Token selection from logits on a CUDA device, for the rows whose sampling
// is greedy: the argmax and its log-probability without copying the logits
// back. The step executor samples other rows on the host (cpu::Sample) from
// copied logits, so non-greedy sampling has one implementation.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace headway::cuda {

// Per row r of logits [rows, vocab] f32 (device): token[r] = argmax (the
// lowest id wins a tie, as cpu::Sample), logprob[r] = logits[r, token] -
// logsumexp(logits[r, :]). -inf logits are allowed (never chosen unless all
// are -inf, then token -1 and logprob -inf). One CTA per row, f32 with a
// max-shifted sum. vocab <= 0 counts as a row of only -inf.
//   token: [rows] int32 (device); logprob: [rows] f32 (device)
void GreedySample(const float* logits, int rows, int vocab, int32_t* token, float* logprob,
                  Stream stream);

// The `k` largest logits of each row, best first (ties: lower id first), and
// their log-probabilities: the OpenAI API's top_logprobs. Ranks as a full
// sort would, as cpu::Sample: -inf logits come after every finite one, by
// id, with logprob -inf; slots beyond vocab get id -1 and logprob -inf.
// Costs k passes over the row (fine for k <= 32; the row stays in L2).
//   ids: [rows, k] int32; logprobs: [rows, k] f32 (device); 1 <= k <= 32
//   (another k launches nothing)
constexpr int kMaxTopLogprobs = 32;
void TopLogprobs(const float* logits, int rows, int vocab, int k, int32_t* ids, float* logprobs,
                 Stream stream);

}  // namespace headway::cuda
