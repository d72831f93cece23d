// QuantMatmulTransBF32Act against the double-accumulating reference applied to
// the dequantised weights (helpers in quant_matmul_test_util.h; llama.cpp's
// 8-bit-activation kernel is checked in quant_matmul_8bit_act_test.cc).
//
// Tolerance (QuantMatmulTransBF32Act): f32 rounding only,
// 1e-5 * sum_j |x_j w_j| + 1e-6 (the worst-case recursive-summation bound
// in 8 lanes, (k / 8 + 3) * 2^-24 of it, is 1.2e-5 at k = 1536 and 1.5e-5
// at k = 2048, but the rounding errors of random data stay far below it;
// a wrong weight exceeds it by orders of magnitude). Its batch invariance
// is checked bit for bit: one activation row at several positions in
// batches of 1 to 100 rows of other random rows, and under 1 and 2 OpenMP
// threads.
//
// Q4_K and Q6_K (256-value super-blocks) run at k = 256, 1024 and 2048
// (Gemma 3 270M's attn_output and ffn_down) with random quants, random
// sub-block scales and finite f16 super-block scales.
//
// The portable, AVX2 and AVX-512 paths share the summation order and must
// agree bit for bit (EveryPathGivesThePortableBits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_vector.h"
#include "kernels/quant_matmul.h"
#include "kernels/threads.h"
#include "tests/kernels/quant_matmul_test_util.h"

namespace headway {
namespace {

using namespace testing;  // NOLINT: the quantised-matmul test helpers

const QuantKernel kF32Act = {"f32act", cpu::QuantMatmulTransBF32Act,
                             cpu::internal::QuantMatmulTransBF32ActPortable,
                             /*rounds_activations=*/false};

TEST(QuantMatmulTest, SupportedTypes) {
  for (GgmlType t : kAllTypes) EXPECT_TRUE(cpu::QuantMatmulSupported(t)) << GgmlTypeName(t);
  for (GgmlType t : {GgmlType::kF32, GgmlType::kBF16, GgmlType::kQ5_K, GgmlType::kQ2_K,
                     GgmlType::kQ5_1}) {
    EXPECT_FALSE(cpu::QuantMatmulSupported(t)) << GgmlTypeName(t);
  }
}

TEST(QuantMatmulTest, SimdPathIsCompiledIn) {
  // The kernels are built for x86-64-v3; losing AVX2 would silently fall back
  // to the (much slower) portable path.
#if defined(__x86_64__)
  EXPECT_NE(cpu::internal::QuantMatmulBestPath(), cpu::internal::QuantMatmulPath::kPortable);
#endif
}

// ---- QuantMatmulTransBF32Act

TEST(QuantMatmulF32ActTest, Q4_1MatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kQ4_1, 1100);
}
TEST(QuantMatmulF32ActTest, Q8_0MatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kQ8_0, 1200);
}
TEST(QuantMatmulF32ActTest, Q4_0MatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kQ4_0, 1300);
}
TEST(QuantMatmulF32ActTest, Q5_0MatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kQ5_0, 1400);
}
TEST(QuantMatmulF32ActTest, F16MatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kF16, 1500);
}
TEST(QuantMatmulF32ActTest, Q4_KMatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kQ4_K, 1550);
}
TEST(QuantMatmulF32ActTest, Q6_KMatchesDequantisedReference) {
  CheckAllShapes(kF32Act, GgmlType::kQ6_K, 1580);
}

TEST(QuantMatmulF32ActTest, EveryTileShape) {
  // Row counts through the register path (1..4) and the scratch path with
  // every 4-row tail; weight-row counts with every column tail, and more
  // rows than one scratch group holds (at most 30 rows per group).
  uint64_t seed = 1600;
  for (GgmlType type : kAllTypes) {
    for (int m : {1, 2, 3, 4, 5, 6, 7, 8}) {
      for (int n : {1, 2, 3, 4, 5, 6, 9, 33, 70}) {
        Check(kF32Act, {type, m, n, TwoBlocks(type)}, seed++);
      }
    }
  }
}

// y[probe, :] for `probe_row` placed at row `pos` of an m-row batch whose
// other rows are random (seeded by `seed`).
std::vector<float> ProbeRow(MatmulFn fn, GgmlType type, const std::vector<uint8_t>& wq,
                            const std::vector<float>& probe_row, int m, int pos, int n, int k,
                            uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(size_t(m) * k);
  for (float& v : x) v = normal(rng);
  std::copy(probe_row.begin(), probe_row.end(), x.begin() + size_t(pos) * k);
  std::vector<float> y(size_t(m) * n, std::nanf(""));
  fn(x.data(), wq.data(), type, m, n, k, y.data());
  return std::vector<float>(y.begin() + size_t(pos) * n, y.begin() + size_t(pos + 1) * n);
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << "column " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(QuantMatmulF32ActTest, BatchInvariantBits) {
  // n = 200 spans several column groups and tails of both paths.
  uint64_t seed = 1700;
  for (GgmlType type : kAllTypes) {
    for (int k : TestKs(type)) {
      if (k == kBlock) k = 2 * kBlock;
      const int n = 200;
      SCOPED_TRACE(GgmlTypeName(type) + " k=" + std::to_string(k));
      std::mt19937_64 rng(seed++);
      const std::vector<uint8_t> wq = RandomWeights(type, n, k, rng);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> probe(k);
      for (float& v : probe) v = normal(rng);
      const std::vector<float> alone =
          ProbeRow(cpu::QuantMatmulTransBF32Act, type, wq, probe, 1, 0, n, k, seed);
      for (int m : {1, 2, 3, 4, 5, 7, 16, 33, 100}) {
        for (int pos : {0, m / 2, m - 1}) {
          SCOPED_TRACE("m=" + std::to_string(m) + " pos=" + std::to_string(pos));
          ExpectSameBits(
              ProbeRow(cpu::QuantMatmulTransBF32Act, type, wq, probe, m, pos, n, k, seed + m),
              alone);
        }
      }
      // The portable path at a few batch sizes.
      for (int m : {1, 5, 16}) {
        SCOPED_TRACE("portable m=" + std::to_string(m));
        ExpectSameBits(ProbeRow(cpu::internal::QuantMatmulTransBF32ActPortable, type, wq, probe,
                                m, m - 1, n, k, seed + 7 * m),
                       alone);
      }
    }
  }
}

TEST(QuantMatmulF32ActTest, ThreadCountInvariantBits) {
  // n * k is far above the threading threshold, so both calls split the
  // columns; with 1 thread one thread does them all.
  const int n = 576;
  std::mt19937_64 rng(1800);
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const int k = IsK(type) ? 1024 : 576;
    const std::vector<uint8_t> wq = RandomWeights(type, n, k, rng);
    for (int m : {1, 3, 16, 100}) {
      SCOPED_TRACE(GgmlTypeName(type) + " m=" + std::to_string(m));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(size_t(m) * k);
      for (float& v : x) v = normal(rng);
      std::vector<float> y1(size_t(m) * n), y2(size_t(m) * n);
      const int saved = cpu::NumThreads();
      cpu::SetNumThreads(1);
      cpu::QuantMatmulTransBF32Act(x.data(), wq.data(), type, m, n, k, y1.data());
      cpu::SetNumThreads(2);
      cpu::QuantMatmulTransBF32Act(x.data(), wq.data(), type, m, n, k, y2.data());
      cpu::SetNumThreads(saved);
      ExpectSameBits(y2, y1);
    }
  }
}

// Every path this machine runs against the portable one, bit for bit, with
// NaN-filled outputs (a column a path fails to write shows). kAvx2Paired is
// kAvx512's code on AVX2 registers: it checks the paired layout, tiles and
// tails on any machine; kAvx512 itself runs only where the CPU has it.
void ExpectPathsAgree(GgmlType type, int m, int n, int k, uint64_t seed) {
  SCOPED_TRACE(GgmlTypeName(type) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
               " k=" + std::to_string(k));
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> wq = RandomWeights(type, n, k, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(m) * k);
  for (float& v : x) v = normal(rng);
  std::vector<float> want(size_t(m) * n, std::nanf(""));
  cpu::internal::QuantMatmulTransBF32ActPortable(x.data(), wq.data(), type, m, n, k, want.data());
  using cpu::internal::QuantMatmulPath;
  for (QuantMatmulPath path : {QuantMatmulPath::kAvx2, QuantMatmulPath::kAvx2Paired,
                               QuantMatmulPath::kAvx512}) {
    if (!cpu::internal::QuantMatmulPathSupported(path)) continue;
    SCOPED_TRACE(cpu::internal::QuantMatmulPathName(path));
    std::vector<float> got(want.size(), std::nanf(""));
    cpu::internal::QuantMatmulTransBF32ActOn(path, x.data(), wq.data(), type, m, n, k,
                                             got.data());
    ExpectSameBits(got, want);
  }
}

TEST(QuantMatmulF32ActTest, EveryPathGivesThePortableBits) {
  // m: the register path (<= 8) and every 4-row tail of the tiles; n: every
  // pair and column tail, odd groups, and more rows than a group holds.
  uint64_t seed = 1900;
  for (GgmlType type : kAllTypes) {
    for (int m : {1, 4, 5, 6, 7, 8, 9, 33}) {
      for (int n : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 70}) {
        ExpectPathsAgree(type, m, n, TwoBlocks(type), seed++);
      }
    }
    for (int k : TestKs(type)) ExpectPathsAgree(type, 37, 200, k, seed++);
  }
}

// The sweeps copy an activation buffer that is not 32-byte aligned (a plain
// std::vector is 16-byte aligned) before reading it: every offset from a
// cache line gives the same bits as the aligned buffer, on every path.
TEST(QuantMatmulF32ActTest, ActivationAlignmentDoesNotChangeBits) {
  constexpr int kM = 9, kN = 33;
  std::mt19937_64 rng(2024);
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ6_K}) {
    const int k = TwoBlocks(type);
    const std::vector<uint8_t> wq = RandomWeights(type, kN, k, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    AlignedVector<float> storage(size_t(kM) * k + 16);
    for (float& v : storage) v = normal(rng);
    using cpu::internal::QuantMatmulPath;
    for (QuantMatmulPath path : {QuantMatmulPath::kAvx2, QuantMatmulPath::kAvx2Paired,
                                 QuantMatmulPath::kAvx512, QuantMatmulPath::kPortable}) {
      if (!cpu::internal::QuantMatmulPathSupported(path)) continue;
      for (int offset = 0; offset < 16; ++offset) {
        SCOPED_TRACE(std::string(cpu::internal::QuantMatmulPathName(path)) + " " +
                     GgmlTypeName(type) + " offset " + std::to_string(offset));
        // The same activations at `offset` floats past a cache line.
        AlignedVector<float> x(size_t(kM) * k + 16);
        std::copy(storage.begin(), storage.begin() + size_t(kM) * k, x.begin() + offset);
        std::vector<float> want(size_t(kM) * kN), got(size_t(kM) * kN, std::nanf(""));
        cpu::internal::QuantMatmulTransBF32ActPortable(storage.data(), wq.data(), type, kM, kN,
                                                       k, want.data());
        cpu::internal::QuantMatmulTransBF32ActOn(path, x.data() + offset, wq.data(), type, kM,
                                                 kN, k, got.data());
        ExpectSameBits(got, want);
      }
    }
  }
}

TEST(QuantMatmulF32ActTest, Avx512WhereTheCpuHasIt) {
  using cpu::internal::QuantMatmulPath;
  if (!cpu::internal::QuantMatmulPathSupported(QuantMatmulPath::kAvx512)) {
    GTEST_SKIP() << "this CPU has no AVX-512F: the AVX-512 path's code is checked as "
                    "avx2-paired; run on an AVX-512 machine to check its instructions";
  }
  EXPECT_EQ(cpu::internal::QuantMatmulBestPath(), QuantMatmulPath::kAvx512);
}

TEST(QuantMatmulF32ActTest, EdgeShapes) {
  std::vector<float> y(6, 1.0f);
  cpu::QuantMatmulTransBF32Act(nullptr, nullptr, GgmlType::kQ8_0, 2, 3, 0, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
  y.assign(6, 1.0f);
  cpu::QuantMatmulTransBF32Act(nullptr, nullptr, GgmlType::kQ8_0, 0, 3, 64, y.data());
  cpu::QuantMatmulTransBF32Act(nullptr, nullptr, GgmlType::kQ8_0, 2, 0, 64, y.data());
  for (float v : y) EXPECT_EQ(v, 1.0f);
}

TEST(QuantMatmulDeathTest, UnsupportedTypeIsACallerBug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP threads may exist
  std::vector<float> x(32), y(1);
  std::vector<uint8_t> w(256);
  EXPECT_DEATH(
      cpu::QuantMatmulTransBF32Act(x.data(), w.data(), GgmlType::kQ5_K, 1, 1, 256, y.data()),
      "QuantMatmulSupported");
  EXPECT_DEATH(
      cpu::QuantMatmulTransBF32Act(x.data(), w.data(), GgmlType::kQ8_0, 1, 1, 31, y.data()),
      "k % BlockValues");
  EXPECT_DEATH(
      cpu::QuantMatmulTransBF32Act(x.data(), w.data(), GgmlType::kQ6_K, 1, 1, 768 - 32, y.data()),
      "k % BlockValues");
}

}  // namespace
}  // namespace headway
