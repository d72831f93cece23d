// cpu::Sample against reference::Sample (full sort) and against the laws
// sampling must obey. Every uniform comes from SeededUniform with fixed
// seeds, so the statistical checks are deterministic and cannot flake.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "kernels/reference/reference.h"
#include "kernels/sampling.h"

namespace headway {
namespace {

std::vector<float> RandomLogits(int vocab, uint64_t seed, float spread = 5.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(rng);
  return logits;
}

double LogSoftmax(const std::vector<float>& logits, int id) {
  double max = logits[0];
  for (float x : logits) max = std::max(max, double(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);
  return logits[id] - max - std::log(sum);
}

TEST(SplitMix64Test, MatchesTheReferenceStream) {
  // The first outputs of Vigna's splitmix64.c from state 0, whose state
  // advances by the golden-ratio increment that SplitMix64 adds first.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
}

TEST(SeededUniformTest, DeterministicAndInRange) {
  std::set<double> seen;
  for (uint64_t seed : {0ULL, 1ULL, 42ULL}) {
    for (uint64_t counter = 0; counter < 1000; ++counter) {
      const double u = SeededUniform(seed, counter);
      EXPECT_EQ(u, SeededUniform(seed, counter));
      EXPECT_GE(u, 0.0);
      EXPECT_LT(u, 1.0);
      seen.insert(u);
    }
  }
  EXPECT_EQ(seen.size(), 3000u);  // no collisions across seeds or counters
  double mean = 0.0;
  for (uint64_t c = 0; c < 100000; ++c) mean += SeededUniform(7, c);
  EXPECT_NEAR(mean / 100000, 0.5, 0.005);
}

TEST(SampleTest, GreedyIsArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  const SampleResult r = cpu::Sample(logits.data(), 5, SamplingConfig{}, 0.99, 0);
  EXPECT_EQ(r.token_id, 1);
  EXPECT_NEAR(r.logprob, LogSoftmax(logits, 1), 1e-6);
  EXPECT_TRUE(r.top_logprobs.empty());

  const std::vector<float> big = RandomLogits(49152, 3);
  const int argmax = int(std::max_element(big.begin(), big.end()) - big.begin());
  EXPECT_EQ(cpu::Sample(big.data(), 49152, SamplingConfig{}, 0.5, 0).token_id, argmax);
}

// Without logprobs the same token is drawn, and no logprob is reported.
TEST(SampleTest, NoLogprobsSamplesTheSameToken) {
  const std::vector<SamplingConfig> configs = {
      {0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 40, 0.9f}, {1.0f, 0, 1.0f, 0.1f}};
  const std::vector<float> logits = RandomLogits(49152, 17, 3.0f);
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    for (uint64_t c = 0; c < 8; ++c) {
      const double u = SeededUniform(ci, c);
      const SampleResult with = cpu::Sample(logits.data(), 49152, configs[ci], u, 0);
      const SampleResult without =
          cpu::Sample(logits.data(), 49152, configs[ci], u, cpu::kNoLogprobs);
      EXPECT_EQ(without.token_id, with.token_id) << "config " << ci;
      EXPECT_LT(with.logprob, 0.0f);
      EXPECT_EQ(without.logprob, 0.0f);
      EXPECT_TRUE(without.top_logprobs.empty());
      EXPECT_EQ(reference::Sample(logits.data(), 49152, configs[ci], u, cpu::kNoLogprobs).token_id,
                with.token_id);
    }
  }
}

TEST(SampleTest, TopKOneIsGreedy) {
  const std::vector<float> logits = RandomLogits(1000, 4);
  const int argmax = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (uint64_t c = 0; c < 50; ++c) {
    const SampleResult r = cpu::Sample(logits.data(), 1000, SamplingConfig{1.5f, 1, 1.0f},
                                       SeededUniform(9, c), 0);
    EXPECT_EQ(r.token_id, argmax);
  }
}

TEST(SampleTest, TinyTopPIsArgmax) {
  const std::vector<float> logits = RandomLogits(1000, 5, 1.0f);
  const int argmax = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (uint64_t c = 0; c < 50; ++c) {
    const SampleResult r = cpu::Sample(logits.data(), 1000, SamplingConfig{1.0f, 0, 1e-6f},
                                       SeededUniform(10, c), 0);
    EXPECT_EQ(r.token_id, argmax);
  }
}

TEST(SampleTest, SameSeedSameTokens) {
  const std::vector<float> logits = RandomLogits(49152, 6, 2.0f);
  const SamplingConfig config{0.8f, 50, 0.9f};
  std::vector<int32_t> first, second;
  for (uint64_t c = 0; c < 20; ++c) {
    first.push_back(cpu::Sample(logits.data(), 49152, config, SeededUniform(11, c), 0).token_id);
  }
  for (uint64_t c = 0; c < 20; ++c) {
    second.push_back(cpu::Sample(logits.data(), 49152, config, SeededUniform(11, c), 0).token_id);
  }
  EXPECT_EQ(first, second);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 1u);  // not degenerate
}

TEST(SampleTest, MatchesReference) {
  const std::vector<SamplingConfig> configs = {
      {0.0f, 0, 1.0f},  {1.0f, 0, 1.0f},  {0.7f, 0, 1.0f}, {1.0f, 40, 1.0f},
      {1.3f, 5, 1.0f},  {1.0f, 0, 0.9f},  {0.5f, 0, 0.5f}, {1.0f, 40, 0.95f},
      {1.0f, 3, 0.01f}, {2.0f, 2000, 0.3f}, {1.0f, 0, 1.0f, 0.1f}, {0.8f, 40, 0.9f, 0.05f},
      {1.5f, 0, 1.0f, 0.9f}, {0.0f, 0, 1.0f, 0.5f}};
  for (int vocab : {1, 7, 1000, 49152}) {
    const std::vector<float> logits = RandomLogits(vocab, vocab, 3.0f);
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      for (uint64_t c = 0; c < (vocab == 49152 ? 4 : 40); ++c) {
        const double u = SeededUniform(ci, c);
        const SampleResult got = cpu::Sample(logits.data(), vocab, configs[ci], u, 5);
        const SampleResult want = reference::Sample(logits.data(), vocab, configs[ci], u, 5);
        ASSERT_EQ(got.token_id, want.token_id) << "vocab " << vocab << " config " << ci;
        EXPECT_NEAR(got.logprob, want.logprob, 1e-5);
        ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
        for (size_t i = 0; i < got.top_logprobs.size(); ++i) {
          EXPECT_EQ(got.top_logprobs[i].first, want.top_logprobs[i].first);
          EXPECT_NEAR(got.top_logprobs[i].second, want.top_logprobs[i].second, 1e-5);
        }
      }
    }
  }
}

TEST(SampleTest, LogprobIsRawLogSoftmaxWhateverTheTemperature) {
  const std::vector<float> logits = RandomLogits(100, 12);
  const SampleResult r =
      cpu::Sample(logits.data(), 100, SamplingConfig{0.3f, 10, 0.8f}, 0.42, 3);
  EXPECT_NEAR(r.logprob, LogSoftmax(logits, r.token_id), 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_GE(r.top_logprobs[0].second, r.top_logprobs[1].second);
  EXPECT_GE(r.top_logprobs[1].second, r.top_logprobs[2].second);
  for (const auto& [id, lp] : r.top_logprobs) EXPECT_NEAR(lp, LogSoftmax(logits, id), 1e-5);
  // More top logprobs than tokens: all of them.
  EXPECT_EQ(cpu::Sample(logits.data(), 100, SamplingConfig{}, 0.0, 500).top_logprobs.size(),
            100u);
}

TEST(SampleTest, TiesInTopLogprobsListLowestIdFirst) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  const SampleResult r = cpu::Sample(logits.data(), 5, SamplingConfig{}, 0.0, 4);
  ASSERT_EQ(r.top_logprobs.size(), 4u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);
  EXPECT_EQ(r.top_logprobs[2].first, 4);
  EXPECT_EQ(r.top_logprobs[3].first, 0);
}

// Frequencies over 200,000 fixed uniforms against the exact probabilities.
// The standard error of a frequency is at most sqrt(0.25 / 2e5) ~ 1.1e-3, so
// 0.006 is over five standard errors; with fixed seeds the result never varies.
std::vector<double> Frequencies(const std::vector<float>& logits, const SamplingConfig& config,
                                uint64_t seed) {
  const int n = 200000;
  std::vector<double> freq(logits.size(), 0.0);
  for (int c = 0; c < n; ++c) {
    const SampleResult r =
        cpu::Sample(logits.data(), int(logits.size()), config, SeededUniform(seed, c), 0);
    freq[r.token_id] += 1.0 / n;
  }
  return freq;
}

TEST(SampleTest, Statistics) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> logits;
  for (double p : probs) logits.push_back(float(std::log(p)));

  // Temperature 1: the distribution itself.
  std::vector<double> freq = Frequencies(logits, SamplingConfig{1.0f, 0, 1.0f}, 1);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(freq[i], probs[i], 0.006) << i;

  // Temperature 2: p^(1/2), renormalised.
  freq = Frequencies(logits, SamplingConfig{2.0f, 0, 1.0f}, 2);
  double z = 0.0;
  for (double p : probs) z += std::sqrt(p);
  for (size_t i = 0; i < probs.size(); ++i) {
    EXPECT_NEAR(freq[i], std::sqrt(probs[i]) / z, 0.006) << i;
  }

  // Top-k 2: tokens 3 and 2 only, as 4:3.
  freq = Frequencies(logits, SamplingConfig{1.0f, 2, 1.0f}, 3);
  EXPECT_EQ(freq[0] + freq[1], 0.0);
  EXPECT_NEAR(freq[3], 4.0 / 7.0, 0.006);

  // Top-p 0.5: 0.4 < 0.5, so 0.3 joins; 0.7 >= 0.5 stops. Same set as top-k 2.
  freq = Frequencies(logits, SamplingConfig{1.0f, 0, 0.5f}, 4);
  EXPECT_EQ(freq[0] + freq[1], 0.0);
  EXPECT_NEAR(freq[3], 4.0 / 7.0, 0.006);

  // Top-p 0.4 is reached by token 3 alone.
  freq = Frequencies(logits, SamplingConfig{1.0f, 0, 0.39f}, 5);
  EXPECT_NEAR(freq[3], 1.0, 1e-9);
}

TEST(SampleTest, MinPDropsTokensBelowItsShareOfTheBest) {
  // Probabilities at temperature 1: token 3 best; token 1 at e^-1 = 0.37 of
  // it, token 0 at e^-3 = 0.05.
  const std::vector<float> logits = {0.0f, 2.0f, -5.0f, 3.0f};
  std::vector<double> freq = Frequencies(logits, SamplingConfig{1.0f, 0, 1.0f, 0.3f}, 17);
  EXPECT_EQ(freq[0], 0.0);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_NEAR(freq[3], 1.0 / (1.0 + std::exp(-1.0)), 0.01);
  // Temperature 2 flattens: token 1 is at e^-0.5 = 0.61 of the best.
  freq = Frequencies(logits, SamplingConfig{2.0f, 0, 1.0f, 0.6f}, 18);
  EXPECT_GT(freq[1], 0.3);
  EXPECT_EQ(freq[0], 0.0);
}

// The formulas of kernels/sampling.h, token by token over the vocabulary.
std::vector<float> ProcessNaively(std::vector<float> logits, const LogitProcessors& p,
                                  const TokenHistory& h) {
  const std::set<int32_t> prompt(h.prompt_ids.begin(), h.prompt_ids.end());
  const std::set<int32_t> allowed(p.allowed.begin(), p.allowed.end());
  for (int t = 0; t < int(logits.size()); ++t) {
    float& l = logits[t];
    if (!allowed.empty() && !allowed.count(t)) l = -std::numeric_limits<float>::infinity();
    const size_t byte = size_t(t) / 8;
    if (!p.allowed_bitmask.empty() &&
        (byte >= p.allowed_bitmask.size() || !(p.allowed_bitmask[byte] & (1 << (t % 8))))) {
      l = -std::numeric_limits<float>::infinity();
    }
    for (const auto& [id, bias] : p.logit_bias) l += id == t ? bias : 0.0f;
    for (int32_t id : p.banned) {
      if (id == t) l = -std::numeric_limits<float>::infinity();
    }
    const auto it = h.output_counts.find(t);
    const int count = it == h.output_counts.end() ? 0 : it->second;
    if (prompt.count(t) || count > 0) {
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
    l -= p.frequency_penalty * float(count);
    l -= p.presence_penalty * float(count > 0);
  }
  return logits;
}

TEST(LogitProcessorsTest, FollowTheFormulaTokenByToken) {
  const std::vector<float> logits = RandomLogits(500, 20);
  TokenHistory history;
  history.prompt_ids = {3, 7, 11, 499, 0};
  history.output_counts = {{7, 2}, {12, 1}, {40, 5}, {0, 1}};
  LogitProcessors p;
  p.logit_bias = {{5, 2.5f}, {12, -100.0f}, {600, 1.0f}};
  p.banned = {9, 40};
  // A structured-output mask over the first 480 ids (the rest: -inf).
  std::string bitmask(60, '\0');
  for (int t = 0; t < 480; t += 3) bitmask[size_t(t) / 8] |= char(1 << (t % 8));
  for (float r : {1.0f, 1.3f, 0.8f}) {
    p.allowed = r == 0.8f ? std::vector<int32_t>{7, 12, 3, 499, 9} : std::vector<int32_t>{};
    p.allowed_bitmask = r == 1.3f ? std::string_view(bitmask) : std::string_view();
    for (float freq : {0.0f, 0.5f, -1.0f}) {
      for (float pres : {0.0f, 1.5f}) {
        p.repetition_penalty = r;
        p.frequency_penalty = freq;
        p.presence_penalty = pres;
        std::vector<float> got = logits;
        cpu::ApplyLogitProcessors(got.data(), 500, p, history);
        const std::vector<float> want = ProcessNaively(logits, p, history);
        for (int t = 0; t < 500; ++t) ASSERT_EQ(got[t], want[t]) << "token " << t;
      }
    }
  }
}

TEST(LogitProcessorsTest, DefaultsChangeNothing) {
  const std::vector<float> logits = RandomLogits(100, 21);
  TokenHistory history;
  history.prompt_ids = {1, 2};
  history.output_counts = {{3, 4}};
  EXPECT_FALSE(LogitProcessors{}.Active());
  std::vector<float> got = logits;
  cpu::ApplyLogitProcessors(got.data(), 100, LogitProcessors{}, history);
  EXPECT_EQ(got, logits);
}

TEST(FillLogprobsTest, GivesSamplesRawLogprobs) {
  const std::vector<float> logits = RandomLogits(1000, 22);
  const SampleResult want = cpu::Sample(logits.data(), 1000, SamplingConfig{}, 0.0, 6);
  SampleResult got;
  got.token_id = want.token_id;
  got.top_logprobs = {{1, 0.0f}};  // replaced
  cpu::FillLogprobs(logits.data(), 1000, 6, &got);
  EXPECT_EQ(got.logprob, want.logprob);
  EXPECT_EQ(got.top_logprobs, want.top_logprobs);
}

TEST(SampleTest, NegativeInfinityLogitsAreNeverSampled) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 0.0f, -inf, 1.0f, -inf};
  for (uint64_t c = 0; c < 200; ++c) {
    const int32_t id =
        cpu::Sample(logits.data(), 5, SamplingConfig{1.0f, 0, 1.0f}, SeededUniform(13, c), 0)
            .token_id;
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
}

}  // namespace
}  // namespace headway
