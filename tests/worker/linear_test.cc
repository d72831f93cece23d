// LinearWeight held in one form (quantised blocks or f32): row dequantisation,
// the serving and the dequantised-f32 products, and the embedding lookup,
// each against the same computation on the matrix dequantised up front (what
// the worker held as its f32 copy before).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/quant_matmul.h"
#include "tests/support/gguf_writer.h"
#include "worker/dequant.h"
#include "worker/linear.h"

namespace headway {
namespace {

std::vector<float> Uniform(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A [rows, cols] matrix held as Q4_1 or Q8_0 blocks, as ModelWeights::Load
// keeps one.
LinearWeight Quantised(GgmlType type, int rows, int cols, uint64_t seed) {
  LinearWeight w;
  w.rows = rows;
  w.cols = cols;
  w.quant_type = type;
  const std::vector<float> values = Uniform(size_t(rows) * cols, seed);
  w.quant = type == GgmlType::kQ8_0 ? testing::QuantizeQ8_0(values) : testing::QuantizeQ4_1(values);
  return w;
}

std::vector<float> DequantizedUpFront(const LinearWeight& w) {
  std::vector<float> out(size_t(w.rows) * w.cols);
  EXPECT_TRUE(Dequantize(w.quant_type, w.quant.data(), out.data(), out.size()).ok());
  return out;
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "index " << i << ": " << got[i]
                                                     << " vs " << want[i];
  }
}

TEST(LinearWeightTest, DequantizesRowsOfEitherForm) {
  const LinearWeight q = Quantised(GgmlType::kQ4_1, 40, 64, 1);
  EXPECT_TRUE(q.f32.empty());
  EXPECT_EQ(q.row_bytes(), 2u * 20);
  EXPECT_EQ(q.num_bytes(), q.quant.size());
  const std::vector<float> all = DequantizedUpFront(q);
  ExpectSameBits(q.ToF32(), all);
  std::vector<float> rows(4 * 64);
  q.DequantizeRows(3, 7, rows.data());
  ExpectSameBits(rows, std::vector<float>(all.begin() + 3 * 64, all.begin() + 7 * 64));

  LinearWeight f;
  f.rows = 5;
  f.cols = 3;
  f.f32 = Uniform(15, 2);
  EXPECT_EQ(f.row_bytes(), 0u);
  ExpectSameBits(f.ToF32(), f.f32);
  std::vector<float> one(3);
  f.DequantizeRows(4, 5, one.data());
  ExpectSameBits(one, std::vector<float>(f.f32.begin() + 12, f.f32.end()));
}

TEST(LinearWeightTest, ZeroBytePaddingRowsAreZero) {
  LinearWeight q = Quantised(GgmlType::kQ8_0, 4, 64, 3);
  q.rows = 6;  // two rows of vocabulary padding, zero bytes
  q.quant.resize(q.quant.size() / 4 * 6, 0);
  std::vector<float> pad(2 * 64, 1.0f);
  q.DequantizeRows(4, 6, pad.data());
  for (float v : pad) EXPECT_EQ(v, 0.0f);
}

TEST(ApplyLinearTest, ServesQuantisedMatricesFromTheirBlocks) {
  const LinearWeight w = Quantised(GgmlType::kQ4_1, 96, 576, 4);
  for (int m : {1, 4, 37}) {
    const std::vector<float> x = Uniform(size_t(m) * w.cols, 5 + m);
    std::vector<float> got(size_t(m) * w.rows), want(got.size());
    ApplyLinear(w, x.data(), m, got.data());
    cpu::QuantMatmulTransBF32Act(x.data(), w.quant.data(), w.quant_type, m, w.rows, w.cols,
                                 want.data());
    ExpectSameBits(got, want);
  }
}

TEST(ApplyLinearTest, DequantisedPathMatchesSgemmOnTheF32Matrix) {
  // 1000 rows of 576: three tiles of rows (448 per tile), the last one short.
  const LinearWeight w = Quantised(GgmlType::kQ8_0, 1000, 576, 6);
  const std::vector<float> w_f32 = DequantizedUpFront(w);
  for (int m : {1, 5, 64}) {
    SCOPED_TRACE(m);
    const std::vector<float> x = Uniform(size_t(m) * w.cols, 7 + m);
    std::vector<float> got(size_t(m) * w.rows, std::nanf("")), want(got.size());
    ApplyLinearDequantised(w, x.data(), m, got.data());
    cpu::MatmulTransB(x.data(), w_f32.data(), m, w.rows, w.cols, want.data());
    for (size_t i = 0; i < got.size(); ++i) {
      // Same products; only sgemm's blocking could order the sums otherwise.
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << "index " << i;
    }
  }
  // A matrix held as f32 takes sgemm directly.
  LinearWeight f;
  f.rows = 7;
  f.cols = 9;
  f.f32 = Uniform(63, 8);
  const std::vector<float> x = Uniform(2 * 9, 9);
  std::vector<float> got(2 * 7), want(2 * 7);
  ApplyLinearDequantised(f, x.data(), 2, got.data());
  cpu::MatmulTransB(x.data(), f.f32.data(), 2, 7, 9, want.data());
  ExpectSameBits(got, want);
}

TEST(EmbeddingLookupTest, QuantisedTableGivesTheDequantisedRows) {
  // 200 tokens x 576 crosses the threading threshold; rows [100, 300) held.
  const LinearWeight table = Quantised(GgmlType::kQ8_0, 200, 576, 10);
  const std::vector<float> table_f32 = DequantizedUpFront(table);
  std::vector<int32_t> ids(200);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> id(0, 400);
  for (int32_t& v : ids) v = id(rng);
  ids[0] = 100;
  ids[1] = 299;
  ids[2] = 300;  // just past the shard: zeros
  ids[3] = 99;
  std::vector<float> got(ids.size() * 576, std::nanf("")), want(got.size());
  EmbeddingLookup(table, 100, ids.data(), int(ids.size()), got.data());
  cpu::EmbeddingShard(table_f32.data(), 100, 300, ids.data(), int(ids.size()), 576, want.data());
  ExpectSameBits(got, want);

  LinearWeight f;
  f.rows = 3;
  f.cols = 2;
  f.f32 = {1, 2, 3, 4, 5, 6};
  const int32_t f_ids[] = {11, 9, 10};
  std::vector<float> out(6, std::nanf(""));
  EmbeddingLookup(f, 10, f_ids, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 0, 0, 1, 2}));
}

}  // namespace
}  // namespace headway
