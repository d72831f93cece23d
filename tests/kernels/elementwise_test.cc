// Embedding, RMSNorm, RoPE, SwiGLU and AddInPlace against the references
// (double arithmetic) and a hand-computed RoPE case.
//
// Tolerances: each output is a handful of f32 operations on values of order 1
// (RoPE at positions up to 1e5 included, since angles are computed in double),
// so 1e-5 relative plus 1e-6 absolute leaves a wide margin over f32 rounding
// (~1e-7) while any wrong index or formula moves values by order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/reference/reference.h"

namespace headway {
namespace {

std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-5 * std::fabs(want[i])) << "index " << i;
  }
}

TEST(EmbeddingTest, CopiesRows) {
  const int vocab = 50, dim = 24;
  const std::vector<float> table = RandomVector(vocab * dim, 1);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 3};
  std::vector<float> got(ids.size() * dim), want(got.size());
  cpu::Embedding(table.data(), ids.data(), int(ids.size()), dim, got.data());
  reference::Embedding(table.data(), ids.data(), int(ids.size()), dim, want.data());
  EXPECT_EQ(got, want);
}

TEST(EmbeddingTest, ShardsSumToTheFullLookup) {
  const int vocab = 50, dim = 8, tp = 3, padded = 51, per_rank = padded / tp;
  std::vector<float> table = RandomVector(padded * dim, 2);
  std::fill(table.begin() + vocab * dim, table.end(), 0.0f);  // padding row
  const std::vector<int32_t> ids = {0, 16, 17, 33, 34, 49};  // range edges
  std::vector<float> want(ids.size() * dim), sum(want.size(), 0.0f), part(want.size());
  reference::Embedding(table.data(), ids.data(), int(ids.size()), dim, want.data());
  for (int r = 0; r < tp; ++r) {
    cpu::EmbeddingShard(table.data() + size_t(r) * per_rank * dim, r * per_rank,
                        (r + 1) * per_rank, ids.data(), int(ids.size()), dim, part.data());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  EXPECT_EQ(sum, want);  // exactly one rank contributes each row; the others add 0
}

TEST(RmsNormTest, MatchesReference) {
  for (int dim : {1, 7, 64, 576}) {
    const int n_rows = 5;
    const std::vector<float> x = RandomVector(size_t(n_rows) * dim, dim, -3.0f, 3.0f);
    const std::vector<float> w = RandomVector(dim, dim + 1);
    std::vector<float> got(x.size()), want(x.size());
    cpu::RmsNorm(x.data(), w.data(), n_rows, dim, 1e-5f, got.data());
    reference::RmsNorm(x.data(), w.data(), n_rows, dim, 1e-5f, want.data());
    ExpectClose(got, want);
  }
}

TEST(RmsNormTest, InPlace) {
  const int dim = 576;
  std::vector<float> x = RandomVector(3 * dim, 2);
  const std::vector<float> w = RandomVector(dim, 3);
  std::vector<float> want(x.size());
  reference::RmsNorm(x.data(), w.data(), 3, dim, 1e-5f, want.data());
  cpu::RmsNorm(x.data(), w.data(), 3, dim, 1e-5f, x.data());
  ExpectClose(x, want);
}

TEST(RopeTest, HandComputedTinyCase) {
  // head_dim 4, base 10000, position 1: pair 0 turns by 1 rad, pair 1 by
  // 10000^(-2/4) = 0.01 rad. x = (1, 0, 0, 1).
  const int32_t pos = 1;
  std::vector<float> x = {1, 0, 0, 1};
  cpu::Rope(x.data(), &pos, 1, 1, 4, 10000.0f, cpu::RopeStyle::kInterleaved);
  // Pairs (x0, x1) and (x2, x3).
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(0.01), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.01), 1e-6);

  x = {1, 0, 0, 1};
  cpu::Rope(x.data(), &pos, 1, 1, 4, 10000.0f, cpu::RopeStyle::kNeox);
  // Pairs (x0, x2) and (x1, x3).
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[1], -std::sin(0.01), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.01), 1e-6);
}

TEST(RopeTest, PositionZeroIsIdentity) {
  std::vector<float> x = RandomVector(3 * 64, 4);
  const std::vector<float> before = x;
  const int32_t pos = 0;
  cpu::Rope(x.data(), &pos, 1, 3, 64, 100000.0f, cpu::RopeStyle::kInterleaved);
  EXPECT_EQ(x, before);
}

TEST(RopeTest, BothStylesMatchReference) {
  const std::vector<int32_t> positions = {0, 1, 2, 17, 255, 1000, 8191, 100000};
  const int n_tokens = int(positions.size());
  for (auto style : {cpu::RopeStyle::kInterleaved, cpu::RopeStyle::kNeox}) {
    for (int head_dim : {2, 64, 128, 256}) {
      for (int n_heads : {1, 9}) {
        std::vector<float> got = RandomVector(size_t(n_tokens) * n_heads * head_dim, head_dim);
        std::vector<float> want = got;
        cpu::Rope(got.data(), positions.data(), n_tokens, n_heads, head_dim, 100000.0f, style);
        reference::Rope(want.data(), positions.data(), n_tokens, n_heads, head_dim, 100000.0f,
                        style);
        ExpectClose(got, want);
      }
    }
  }
}

// A forward pass computes the angles once per base and reuses the struct
// across passes: a smaller batch with another base must not see the old
// rows, and every angle is the double cos and sin rounded once.
TEST(RopeTest, AnglesComputedOnceMatchReferenceAcrossReuse) {
  cpu::RopeAngles angles;
  const std::vector<int32_t> long_batch = {0, 1, 2, 17, 255, 1000, 8191, 100000};
  const std::vector<int32_t> short_batch = {5, 3, 70000};
  const int head_dim = 64, n_heads = 9;
  for (auto [positions, base] : {std::pair{long_batch, 10000.0f}, std::pair{short_batch, 1e6f}}) {
    const int n_tokens = int(positions.size());
    cpu::ComputeRopeAngles(positions.data(), n_tokens, head_dim, base, &angles);
    ASSERT_EQ(angles.cos.size(), size_t(n_tokens) * head_dim / 2);
    const double theta = positions[2] * std::pow(double(base), -2.0 * 5 / head_dim);
    EXPECT_EQ(angles.cos[size_t(2) * head_dim / 2 + 5], float(std::cos(theta)));
    EXPECT_EQ(angles.sin[size_t(2) * head_dim / 2 + 5], float(std::sin(theta)));
    for (auto style : {cpu::RopeStyle::kInterleaved, cpu::RopeStyle::kNeox}) {
      std::vector<float> got = RandomVector(size_t(n_tokens) * n_heads * head_dim, 7);
      std::vector<float> want = got;
      cpu::Rope(got.data(), angles, n_heads, style);
      reference::Rope(want.data(), positions.data(), n_tokens, n_heads, head_dim, base, style);
      ExpectClose(got, want);
    }
  }
}

TEST(SwiGluTest, MatchesReferenceAndAliases) {
  const int64_t n = 1536 * 3 + 5;
  std::vector<float> gate = RandomVector(n, 5, -20.0f, 20.0f);
  const std::vector<float> up = RandomVector(n, 6, -2.0f, 2.0f);
  std::vector<float> want(n);
  reference::SwiGlu(gate.data(), up.data(), n, want.data());
  cpu::SwiGlu(gate.data(), up.data(), n, gate.data());
  ExpectClose(gate, want);
}

TEST(GeluTanhGatedTest, MatchesReferenceAndAliases) {
  const int64_t n = 2048 * 3 + 7;
  std::vector<float> gate = RandomVector(n, 9, -12.0f, 12.0f);
  const std::vector<float> up = RandomVector(n, 10, -2.0f, 2.0f);
  std::vector<float> want(n);
  reference::GeluTanhGated(gate.data(), up.data(), n, want.data());
  cpu::GeluTanhGated(gate.data(), up.data(), n, gate.data());
  ExpectClose(gate, want);
}

TEST(GeluTanhGatedTest, KnownValues) {
  // gelu_tanh(1) = 0.8411920, gelu_tanh(-1) = -0.1588080 (PyTorch
  // torch.nn.functional.gelu(x, approximate="tanh")), gelu(0) = 0.
  const std::vector<float> gate = {1.0f, -1.0f, 0.0f};
  const std::vector<float> up = {1.0f, 2.0f, 5.0f};
  std::vector<float> out(3);
  cpu::GeluTanhGated(gate.data(), up.data(), 3, out.data());
  EXPECT_NEAR(out[0], 0.8411920f, 1e-6f);
  EXPECT_NEAR(out[1], -2.0f * 0.1588080f, 1e-6f);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(ScaleInPlaceTest, Scales) {
  std::vector<float> out = {1.0f, -2.0f, 0.5f};
  cpu::ScaleInPlace(out.data(), 4.0f, 3);
  EXPECT_EQ(out, (std::vector<float>{4.0f, -8.0f, 2.0f}));
}

TEST(AddInPlaceTest, Adds) {
  std::vector<float> out = RandomVector(1001, 7);
  const std::vector<float> x = RandomVector(1001, 8);
  std::vector<float> want(out.size());
  for (size_t i = 0; i < out.size(); ++i) want[i] = out[i] + x[i];
  cpu::AddInPlace(out.data(), x.data(), int64_t(out.size()));
  EXPECT_EQ(out, want);
}

}  // namespace
}  // namespace headway
