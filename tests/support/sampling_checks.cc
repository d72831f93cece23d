#include "tests/support/sampling_checks.h"

#include <gtest/gtest.h>

#include <map>

namespace headway::testing {

using nlohmann::json;

void ExpectGreedyFollowsPenalties(const Deployment& deployment, const std::string& prompt,
                                  double frequency, double presence, bool plain_repeats) {
  json body = {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0},
               {"ignore_eos", true}, {"logprobs", 20}};
  HttpReply plain = deployment.PostJson("/v1/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  body["frequency_penalty"] = frequency;
  body["presence_penalty"] = presence;
  HttpReply r = deployment.PostJson("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  if (plain_repeats) {
    EXPECT_NE(r.json["choices"][0]["text"], plain.json["choices"][0]["text"]);
  }
  const json& lp = r.json["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 16u);
  std::map<std::string, int> counts;
  for (size_t i = 0; i < 16; ++i) {
    const std::string chosen = lp["tokens"][i];
    std::string best;
    double best_score = -1e30;
    for (auto& [token, logprob] : lp["top_logprobs"][i].items()) {
      const int n = counts.count(token) ? counts[token] : 0;
      const double score = logprob.get<double>() - frequency * n - presence * (n > 0);
      if (score > best_score) best_score = score, best = token;
    }
    EXPECT_EQ(chosen, best) << "token " << i << " of " << r.json["choices"][0]["text"];
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(),
                lp["top_logprobs"][i][chosen].get<double>(), 1e-5);
    ++counts[chosen];
  }
}

}  // namespace headway::testing
