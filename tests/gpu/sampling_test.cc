// kernels/cuda/sampling.h against a plain host argmax / sort and a double
// logsumexp, with ties (lowest id first), -inf logits and rows of only -inf.
// Ids must match exactly; log-probabilities to 2e-5 (the device sums exp in
// f32 over up to 152K values: relative error of the sum ~1e-6).
#include "kernels/cuda/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test.h"

namespace headway {
namespace {

using testing::RecordError;
using testing::Sync;
using testing::ToDevice;
using testing::ToHost;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// rows x vocab logits: normal * 4, with per-row twists: row 1 has a tie for
// the maximum at two ids, row 2 has many -inf, row 3 is all -inf (when
// rows > 3), row 4 is all equal.
std::vector<float> Logits(int rows, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(size_t(rows) * vocab);
  for (float& v : logits) v = normal(rng);
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  if (rows > 1) {
    float* row = &logits[size_t(vocab)];
    const int a = pick(rng), b = pick(rng);
    row[a] = row[b] = 40.0f;
    // More ties just below, for the later top-k ranks.
    for (int i = 0; i < 5; ++i) row[pick(rng)] = 30.0f;
  }
  if (rows > 2) {
    float* row = &logits[size_t(2) * vocab];
    for (int i = 0; i < vocab; ++i) {
      if (i % 3 != 1) row[i] = kNegInf;
    }
  }
  if (rows > 3) std::fill_n(&logits[size_t(3) * vocab], vocab, kNegInf);
  if (rows > 4) std::fill_n(&logits[size_t(4) * vocab], vocab, 1.5f);
  return logits;
}

// log(sum exp(row)) in double; -inf for a row of only -inf.
double LogSumExp(const float* row, int vocab) {
  double max_value = -INFINITY;
  for (int i = 0; i < vocab; ++i) max_value = std::max(max_value, double(row[i]));
  if (std::isinf(max_value)) return max_value;
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - max_value);
  return max_value + std::log(sum);
}

TEST(CudaSampling, GreedySampleMatchesHostArgmax) {
  HW_SKIP_WITHOUT_GPU();
  for (int vocab : {1, 33, 1000, 49152, 151936}) {
    for (uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE("vocab=" + std::to_string(vocab) + " seed=" + std::to_string(seed));
      const int rows = 6;
      const std::vector<float> logits = Logits(rows, vocab, seed);
      cuda::DeviceBuffer d_logits = ToDevice(logits);
      cuda::DeviceBuffer d_token = ToDevice(std::vector<int32_t>(rows, -7));
      cuda::DeviceBuffer d_logprob = ToDevice(std::vector<float>(rows, std::nanf("")));
      cuda::GreedySample(d_logits.as<float>(), rows, vocab, d_token.as<int32_t>(),
                         d_logprob.as<float>(), nullptr);
      Sync("GreedySample");
      const std::vector<int32_t> token = ToHost<int32_t>(d_token.data(), rows);
      const std::vector<float> logprob = ToHost<float>(d_logprob.data(), rows);
      double max_err = 0.0;
      for (int r = 0; r < rows; ++r) {
        const float* row = &logits[size_t(r) * vocab];
        int32_t want = -1;
        for (int i = 0; i < vocab; ++i) {
          if (row[i] != kNegInf && (want < 0 || row[i] > row[want])) want = i;
        }
        EXPECT_EQ(token[r], want) << "row " << r;
        if (want < 0) {
          EXPECT_EQ(logprob[r], kNegInf) << "row " << r;
          continue;
        }
        const double want_lp = double(row[want]) - LogSumExp(row, vocab);
        max_err = std::max(max_err, std::fabs(double(logprob[r]) - want_lp));
        EXPECT_FALSE(std::isnan(logprob[r])) << "row " << r;
      }
      EXPECT_LE(RecordError(max_err), 2e-5) << "max abs error of the log-probabilities";
    }
  }
}

TEST(CudaSampling, TopLogprobsMatchesHostSort) {
  HW_SKIP_WITHOUT_GPU();
  for (int vocab : {3, 40, 1000, 49152, 151936}) {
    for (int k : {1, 5, 32}) {
      for (uint64_t seed : {3u}) {
        SCOPED_TRACE("vocab=" + std::to_string(vocab) + " k=" + std::to_string(k) +
                     " seed=" + std::to_string(seed));
        const int rows = 6;
        const std::vector<float> logits = Logits(rows, vocab, seed);
        cuda::DeviceBuffer d_logits = ToDevice(logits);
        cuda::DeviceBuffer d_ids = ToDevice(std::vector<int32_t>(size_t(rows) * k, -7));
        cuda::DeviceBuffer d_lp = ToDevice(std::vector<float>(size_t(rows) * k, std::nanf("")));
        cuda::TopLogprobs(d_logits.as<float>(), rows, vocab, k, d_ids.as<int32_t>(),
                          d_lp.as<float>(), nullptr);
        Sync("TopLogprobs");
        const std::vector<int32_t> ids = ToHost<int32_t>(d_ids.data(), size_t(rows) * k);
        const std::vector<float> lp = ToHost<float>(d_lp.data(), size_t(rows) * k);
        double max_err = 0.0;
        for (int r = 0; r < rows; ++r) {
          const float* row = &logits[size_t(r) * vocab];
          // A full sort by value, then id (-inf last, by id), as cpu::Sample ranks.
          std::vector<int32_t> order(vocab);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t a, int32_t b) { return row[a] > row[b]; });
          const double lse = LogSumExp(row, vocab);
          for (int t = 0; t < k; ++t) {
            const size_t at = size_t(r) * k + t;
            if (t >= vocab) {
              EXPECT_EQ(ids[at], -1) << "row " << r << " rank " << t;
              EXPECT_EQ(lp[at], kNegInf) << "row " << r << " rank " << t;
              continue;
            }
            const int32_t want = order[t];
            EXPECT_EQ(ids[at], want) << "row " << r << " rank " << t;
            if (row[want] == kNegInf) {
              EXPECT_EQ(lp[at], kNegInf) << "row " << r << " rank " << t;
              continue;
            }
            const double want_lp = double(row[want]) - lse;
            max_err = std::max(max_err, std::fabs(double(lp[at]) - want_lp));
            EXPECT_FALSE(std::isnan(lp[at])) << "row " << r << " rank " << t;
          }
        }
        EXPECT_LE(RecordError(max_err), 2e-5) << "max abs error of the log-probabilities";
      }
    }
  }
}

}  // namespace
}  // namespace headway
