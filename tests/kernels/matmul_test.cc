// MatmulTransB (OpenBLAS) against the double-accumulating reference.
//
// Tolerance: a dot product of k terms in [-1, 1] has an f32 rounding error
// below k * 2^-24 * sqrt(k)-ish in practice; 2e-6 * k absolute (1.2e-3 at
// k = 576, results of order sqrt(k) ~ 10) is loose enough for any summation
// order OpenBLAS picks and tight enough to catch a wrong index or transpose.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/reference/reference.h"

namespace headway {
namespace {

void CheckShape(int m, int n, int k, uint64_t seed) {
  SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(size_t(m) * k), w(size_t(n) * k);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  std::vector<float> got(size_t(m) * n, std::nanf("")), want(got.size());
  cpu::MatmulTransB(x.data(), w.data(), m, n, k, got.data());
  reference::MatmulTransB(x.data(), w.data(), m, n, k, want.data());
  const float tolerance = 2e-6f * std::max(k, 1);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance) << "index " << i;
  }
}

TEST(MatmulTest, ModelShapes) {
  CheckShape(16, 1536, 576, 1);  // MLP up
  CheckShape(1, 576, 1536, 2);   // MLP down, one decode token
  CheckShape(7, 192, 576, 3);    // K projection, odd batch
}

TEST(MatmulTest, OddShapes) {
  CheckShape(1, 1, 1, 4);
  CheckShape(3, 5, 7, 5);
  CheckShape(33, 17, 65, 6);
}

TEST(MatmulTest, EmptySumIsZero) {
  std::vector<float> y(6, 1.0f);
  cpu::MatmulTransB(nullptr, nullptr, 2, 3, 0, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace headway
