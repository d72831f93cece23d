// Limits of the step protocol that the coordinator's scheduler and the
// workers must agree on.
#pragma once

namespace headway {

// Most prompt rows of one step whose logprobs are computed (prompt_logprobs,
// completions' echo), over all its sequences. Their logits exist at once on
// TP rank 0: 64 rows of Gemma 3's 262,144-token vocabulary are 64 MiB of f32.
// A longer prompt takes more steps.
inline constexpr int kMaxPromptLogprobRowsPerStep = 64;

}  // namespace headway
