// llama.cpp's 8-bit-activation quantised matmul
// (kernels/reference/quant_matmul_8bit_act.h) against the double-accumulating
// reference applied to the dequantised weights (helpers in
// quant_matmul_test_util.h).
//
// Tolerance: the kernel rounds each activation block to qx = round(x / dx),
// dx = max|x_b| / 127, which moves every value by at most dx / 2; a block b
// therefore adds at most (max_{j in b}|x_j| / 254) * sum_{j in b}|w_j| to the
// error of an output (an absolute bound, so at most 1/127 of max|x| * sum|w|
// per block; 1/254 of it up to rounding). We allow 1.01 times that sum over
// blocks, plus 1e-5 * sum_j |x_j w_j| + 1e-6 for f32 accumulation. F16
// weights skip activation rounding and get only the f32 term.
//
// The portable and AVX2 paths share the summation order and must agree bit
// for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/quant_matmul.h"
#include "kernels/reference/quant_matmul_8bit_act.h"
#include "kernels/reference/reference.h"
#include "tests/kernels/quant_matmul_test_util.h"

namespace headway {
namespace {

using namespace testing;  // NOLINT: the quantised-matmul test helpers

const QuantKernel k8BitAct = {"int8act", reference::QuantMatmulTransB8BitAct,
                              reference::internal::QuantMatmulTransB8BitActPortable,
                              /*rounds_activations=*/true};

TEST(QuantMatmulTest, Q4_1MatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kQ4_1, 100);
}
TEST(QuantMatmulTest, Q8_0MatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kQ8_0, 200);
}
TEST(QuantMatmulTest, Q4_0MatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kQ4_0, 300);
}
TEST(QuantMatmulTest, Q5_0MatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kQ5_0, 400);
}
TEST(QuantMatmulTest, F16MatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kF16, 500);
}
TEST(QuantMatmulTest, Q4_KMatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kQ4_K, 550);
}
TEST(QuantMatmulTest, Q6_KMatchesDequantisedReference) {
  CheckAllShapes(k8BitAct, GgmlType::kQ6_K, 580);
}

TEST(QuantMatmulTest, EveryTileShape) {
  // Activation-row tails of 1..3 rows and weight-row tails of 1..3 rows.
  uint64_t seed = 600;
  for (GgmlType type : kAllTypes) {
    for (int m : {3, 4, 6, 7}) {
      for (int n : {2, 3, 4, 5, 6, 9}) Check(k8BitAct, {type, m, n, TwoBlocks(type)}, seed++);
    }
  }
}

TEST(QuantMatmulTest, ZeroActivationsGiveZero) {
  // An all-zero block has dx = 0; it must give 0, not NaN from 0 / 0.
  const int m = 2, n = 3, k = 64;
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> wq = RandomWeights(GgmlType::kQ4_1, n, k, rng);
  std::vector<float> x(size_t(m) * k, 0.0f), y(size_t(m) * n, 1.0f);
  reference::QuantMatmulTransB8BitAct(x.data(), wq.data(), GgmlType::kQ4_1, m, n, k, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(QuantMatmulTest, EmptySumIsZero) {
  std::vector<float> y(6, 1.0f);
  reference::QuantMatmulTransB8BitAct(nullptr, nullptr, GgmlType::kQ8_0, 2, 3, 0, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(QuantMatmulTest, ReferenceSimdPathIsCompiledIn) {
  // Built with the kernels' flags (x86-64-v3), like the serving kernel.
#if defined(__x86_64__)
  EXPECT_TRUE(reference::internal::QuantMatmul8BitActHasSimd());
#endif
}

TEST(QuantMatmulF32ActTest, MoreAccurateThanInt8Activations) {
  // The point of the mode: on hidden-state-like rows (a few large values),
  // its worst error is far below the 8-bit mode's.
  const int m = 4, n = 256, k = 576;
  std::mt19937_64 rng(1900);
  const std::vector<uint8_t> wq = RandomWeights(GgmlType::kQ4_1, n, k, rng);
  std::vector<float> w(size_t(n) * k);
  for (int i = 0; i < n; ++i) {
    const std::vector<float> row = DequantizeRow(GgmlType::kQ4_1, wq.data() + i * k / 32 * 20, k);
    std::copy(row.begin(), row.end(), w.begin() + size_t(i) * k);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(m) * k);
  for (float& v : x) v = normal(rng);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
  std::vector<float> exact(size_t(m) * n), f32act(exact.size()), int8act(exact.size());
  reference::MatmulTransB(x.data(), w.data(), m, n, k, exact.data());
  cpu::QuantMatmulTransBF32Act(x.data(), wq.data(), GgmlType::kQ4_1, m, n, k, f32act.data());
  reference::QuantMatmulTransB8BitAct(x.data(), wq.data(), GgmlType::kQ4_1, m, n, k,
                                      int8act.data());
  double err_f32 = 0.0, err_int8 = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    err_f32 = std::max(err_f32, double(std::fabs(f32act[i] - exact[i])));
    err_int8 = std::max(err_int8, double(std::fabs(int8act[i] - exact[i])));
  }
  EXPECT_LT(err_f32 * 100.0, err_int8) << err_f32 << " vs " << err_int8;
}

TEST(QuantMatmulDeathTest, UnsupportedTypeIsACallerBug8BitAct) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP threads may exist
  std::vector<float> x(32), y(1);
  std::vector<uint8_t> w(256);
  auto run = [&](GgmlType type, int k) {
    reference::QuantMatmulTransB8BitAct(x.data(), w.data(), type, 1, 1, k, y.data());
  };
  EXPECT_DEATH(run(GgmlType::kQ5_K, 256), "QuantMatmulSupported");
  EXPECT_DEATH(run(GgmlType::kQ8_0, 31), "k % BlockValues");
  // K types need whole 256-value super-blocks.
  EXPECT_DEATH(run(GgmlType::kQ4_K, 32), "k % BlockValues");
}

}  // namespace
}  // namespace headway
