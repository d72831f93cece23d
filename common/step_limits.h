// Limits of the step protocol that the coordinator's scheduler and the
// workers must agree on.
#pragma once

#include <algorithm>
#include <cstdint>

namespace headway {

// Bytes of f32 logits that the prompt logprob rows of one step (prompt_logprobs,
// completions' echo) may take at once on TP rank 0, over all its sequences.
inline constexpr int64_t kPromptLogprobLogitBytesPerStep = int64_t{64} << 20;

// Most prompt logprob rows of one step for a vocabulary of `vocab_size`
// tokens: as many as fit kPromptLogprobLogitBytesPerStep, and at least 16
// (Gemma 3's 262,144 tokens: 64 rows; SmolLM2's 49,152: 341). A longer
// prompt takes more steps.
inline int MaxPromptLogprobRowsPerStep(int vocab_size) {
  const int64_t row_bytes = 4 * int64_t(std::max(1, vocab_size));
  return int(std::clamp<int64_t>(kPromptLogprobLogitBytesPerStep / row_bytes, 16, 1 << 20));
}

}  // namespace headway
