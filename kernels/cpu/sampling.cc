// Token sampling, CPU backend, and the seeded uniform source.
//
// Candidate order is (logit descending, id ascending) everywhere, so ties are
// broken the same way by greedy, top-k, top-p and top logprobs. Inverse-CDF
// sampling walks the kept tokens in ascending id order; kernels/reference
// follows the same rules, so both pick the same token for the same uniform.
#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace headway {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double SeededUniform(uint64_t seed, uint64_t counter) {
  // Mixing the seed first keeps (seed, counter + 1) and (seed + 1, counter) apart.
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return double(bits >> 11) * 0x1.0p-53;  // 53 random bits: [0, 1)
}

namespace cpu {
namespace {

// The `k` best ids, best first, in O(vocab + k log k).
std::vector<int32_t> TopIds(const float* logits, int vocab_size, int k) {
  const auto better = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> ids(vocab_size);
  std::iota(ids.begin(), ids.end(), 0);
  k = std::clamp(k, 0, vocab_size);
  if (k < vocab_size) {
    std::nth_element(ids.begin(), ids.begin() + k, ids.end(), better);
    ids.resize(k);
  }
  std::sort(ids.begin(), ids.end(), better);
  return ids;
}

// The best id, the lowest on ties.
int32_t Argmax(const float* logits, int vocab_size) {
  int32_t best = 0;
  for (int i = 1; i < vocab_size; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

// Log partition of `logits` whose largest entry is logits[argmax], in double.
double LogPartition(const float* logits, int vocab_size, int32_t argmax) {
  const double max_logit = logits[argmax];
  double sum = 0.0;
  for (int i = 0; i < vocab_size; ++i) sum += std::exp(double(logits[i]) - max_logit);
  return max_logit + std::log(sum);
}

}  // namespace

void ApplyLogitProcessors(float* logits, int vocab_size, const LogitProcessors& processors,
                          const TokenHistory& history) {
  if (!processors.allowed.empty()) {
    std::vector<float> kept(processors.allowed.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      const int32_t id = processors.allowed[i];
      kept[i] = id >= 0 && id < vocab_size ? logits[id] : 0.0f;
    }
    std::fill(logits, logits + vocab_size, -std::numeric_limits<float>::infinity());
    for (size_t i = 0; i < kept.size(); ++i) {
      const int32_t id = processors.allowed[i];
      if (id >= 0 && id < vocab_size) logits[id] = kept[i];
    }
  }
  if (!processors.allowed_bitmask.empty()) {
    const std::string_view mask = processors.allowed_bitmask;
    for (int t = 0; t < vocab_size; ++t) {
      const size_t byte = size_t(t) / 8;
      if (byte >= mask.size() || !((static_cast<unsigned char>(mask[byte]) >> (t % 8)) & 1)) {
        logits[t] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  for (const auto& [id, bias] : processors.logit_bias) {
    if (id >= 0 && id < vocab_size) logits[id] += bias;
  }
  for (int32_t id : processors.banned) {
    if (id >= 0 && id < vocab_size) logits[id] = -std::numeric_limits<float>::infinity();
  }
  const float r = processors.repetition_penalty;
  const auto repeat = [&](int32_t id) {
    float& l = logits[id];
    l = l > 0.0f ? l / r : l * r;
  };
  if (r != 1.0f) {
    for (const auto& [id, count] : history.output_counts) repeat(id);
    for (int32_t id : history.prompt_ids) {
      if (!history.output_counts.count(id)) repeat(id);
    }
  }
  if (processors.frequency_penalty != 0.0f || processors.presence_penalty != 0.0f) {
    for (const auto& [id, count] : history.output_counts) {
      if (count <= 0) continue;
      logits[id] -= processors.frequency_penalty * float(count);
      logits[id] -= processors.presence_penalty;
    }
  }
}

void FillLogprobs(const float* logits, int vocab_size, int num_top_logprobs,
                  SampleResult* result) {
  const double log_z = LogPartition(logits, vocab_size, Argmax(logits, vocab_size));
  result->logprob = float(logits[result->token_id] - log_z);
  result->top_logprobs.clear();
  if (num_top_logprobs > 0) {
    for (int32_t id : TopIds(logits, vocab_size, num_top_logprobs)) {
      result->top_logprobs.emplace_back(id, float(logits[id] - log_z));
    }
  }
}

SampleResult Sample(const float* logits, int vocab_size, const SamplingConfig& config,
                    double uniform, int num_top_logprobs) {
  SampleResult result;
  if (vocab_size <= 0) return result;  // token_id stays -1

  // One pass for the argmax (lowest id on ties), one for the log partition
  // when logprobs are wanted.
  const int32_t argmax = Argmax(logits, vocab_size);
  const double max_logit = logits[argmax];
  const bool logprobs = num_top_logprobs != kNoLogprobs;
  const double log_z = logprobs ? LogPartition(logits, vocab_size, argmax) : 0.0;

  if (num_top_logprobs > 0) {
    for (int32_t id : TopIds(logits, vocab_size, num_top_logprobs)) {
      result.top_logprobs.emplace_back(id, float(logits[id] - log_z));
    }
  }

  if (config.temperature <= 0.0f) {
    result.token_id = argmax;
    if (logprobs) result.logprob = float(logits[argmax] - log_z);
    return result;
  }

  const double t = config.temperature;
  const double max_scaled = max_logit / t;
  const auto weight = [&](int32_t id) { return std::exp(double(logits[id]) / t - max_scaled); };
  // min-p keeps a best-first prefix, as top-k does: the kept set is the
  // shorter of the two prefixes.
  int keep = config.top_k > 0 ? std::min(config.top_k, vocab_size) : vocab_size;
  if (config.min_p > 0.0f) {
    int above = 0;
    for (int i = 0; i < vocab_size; ++i) above += weight(i) >= double(config.min_p);
    keep = std::min(keep, std::max(above, 1));
  }
  const bool use_top_k = keep < vocab_size;
  const bool use_top_p = config.top_p < 1.0f;

  std::vector<int32_t> kept;  // ascending ids once filtered
  if (use_top_k || use_top_p) {
    kept = TopIds(logits, vocab_size, keep);
    if (use_top_p) {
      double total = 0.0;
      for (int32_t id : kept) total += weight(id);
      // Smallest best-first prefix whose probability reaches top_p.
      const double target = double(config.top_p) * total;
      double cumulative = 0.0;
      size_t n = 0;
      while (n < kept.size() && cumulative < target) cumulative += weight(kept[n++]);
      kept.resize(std::max<size_t>(n, 1));
    }
    std::sort(kept.begin(), kept.end());
  } else {
    kept.resize(vocab_size);
    std::iota(kept.begin(), kept.end(), 0);
  }

  std::vector<double> weights(kept.size());
  double kept_total = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    weights[i] = weight(kept[i]);
    kept_total += weights[i];
  }
  const double target = uniform * kept_total;
  double cumulative = 0.0;
  result.token_id = kept.back();  // if rounding leaves target past the last sum
  for (size_t i = 0; i < kept.size(); ++i) {
    cumulative += weights[i];
    if (target < cumulative) {
      result.token_id = kept[i];
      break;
    }
  }
  if (logprobs) result.logprob = float(logits[result.token_id] - log_z);
  return result;
}

}  // namespace cpu
}  // namespace headway
