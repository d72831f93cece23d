// Checks of a deployment's sampling through the OpenAI API that more than
// one suite runs (ApiTest at TP 1, TensorParallelE2eTest at TP 3).
#pragma once

#include <string>

#include "tests/support/deployment.h"

namespace headway::testing {

// Sends `prompt` to /v1/completions greedily (16 tokens, ignore_eos, 20 top
// logprobs) with `frequency` and `presence` penalties, and expects each
// token to be the best of the returned raw top logprobs once OpenAI's
// penalties (frequency x count + presence x (count > 0)), computed from the
// tokens generated before it, are taken off; and the returned logprob to be
// the raw one. When `plain_repeats`, also expects the answer to differ from
// the same request without penalties (the penalties had something to do).
void ExpectGreedyFollowsPenalties(const Deployment& deployment, const std::string& prompt,
                                  double frequency, double presence, bool plain_repeats);

}  // namespace headway::testing
