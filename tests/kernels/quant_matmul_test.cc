// QuantMatmulTransB and QuantMatmulTransBF32Act against the
// double-accumulating reference applied to the dequantised weights.
//
// Tolerance, 8-bit activations (QuantMatmulTransB): the kernel rounds each
// activation block to qx = round(x / dx), dx = max|x_b| / 127, which moves
// every value by at most dx / 2; a block b therefore adds at most
// (max_{j in b}|x_j| / 254) * sum_{j in b}|w_j| to the error of an output
// (an absolute bound, so at most 1/127 of max|x| * sum|w| per block; 1/254 of
// it up to rounding). We allow 1.01 times that sum over blocks, plus
// 1e-5 * sum_j |x_j w_j| + 1e-6 for f32 accumulation. F16 weights skip
// activation rounding and get only the f32 term.
//
// Tolerance, f32 activations (QuantMatmulTransBF32Act): f32 rounding only,
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
// In both modes the portable and AVX2 paths share the summation order and
// must agree bit for bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant_matmul.h"
#include "kernels/reference/reference.h"
#include "tests/support/gguf_writer.h"

namespace headway {
namespace {

using testing::FloatToHalf;

constexpr int kBlock = 32;

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  // IEEE half: no inf / NaN arise in these tests.
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(float(mant), -24);
  return sign * std::ldexp(float(mant | 0x400), exp - 25);
}

bool IsK(GgmlType type) { return type == GgmlType::kQ4_K || type == GgmlType::kQ6_K; }

int BlockValues(GgmlType type) { return IsK(type) ? 256 : kBlock; }

int BlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return 34;
    case GgmlType::kQ4_0: return 18;
    case GgmlType::kQ4_1: return 20;
    case GgmlType::kQ5_0: return 22;
    case GgmlType::kQ4_K: return 144;
    case GgmlType::kQ6_K: return 210;
    default: return 64;  // F16
  }
}

// Q4_K's 6-bit scale and min of sub-block j (ggml-quants.c get_scale_min_k4).
void ScaleMinK4(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Dequantises one row of k values, following the layouts in worker/dequant.h
// (and, for Q4_K and Q6_K, its loops, which are ggml's dequantize_row_q*_K).
std::vector<float> DequantizeRow(GgmlType type, const uint8_t* row, int k) {
  std::vector<float> out(k);
  for (int b = 0; b < k / BlockValues(type); ++b) {
    const uint8_t* blk = row + b * BlockBytes(type);
    float* y = out.data() + b * BlockValues(type);
    switch (type) {
      case GgmlType::kQ8_0:
        for (int j = 0; j < kBlock; ++j) y[j] = Half(blk) * float(int8_t(blk[2 + j]));
        break;
      case GgmlType::kQ4_0:
        for (int j = 0; j < 16; ++j) {
          y[j] = Half(blk) * float((blk[2 + j] & 15) - 8);
          y[j + 16] = Half(blk) * float((blk[2 + j] >> 4) - 8);
        }
        break;
      case GgmlType::kQ4_1:
        for (int j = 0; j < 16; ++j) {
          y[j] = Half(blk) * float(blk[4 + j] & 15) + Half(blk + 2);
          y[j + 16] = Half(blk) * float(blk[4 + j] >> 4) + Half(blk + 2);
        }
        break;
      case GgmlType::kQ5_0: {
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        for (int j = 0; j < 16; ++j) {
          const int lo = (blk[6 + j] & 15) | (((qh >> j) & 1) << 4);
          const int hi = (blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
          y[j] = Half(blk) * float(lo - 16);
          y[j + 16] = Half(blk) * float(hi - 16);
        }
        break;
      }
      case GgmlType::kQ4_K: {
        const float d = Half(blk), dmin = Half(blk + 2);
        const uint8_t* q = blk + 16;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
          int sc = 0, mn = 0;
          ScaleMinK4(is, blk + 4, &sc, &mn);
          const float d1 = d * float(sc), m1 = dmin * float(mn);
          ScaleMinK4(is + 1, blk + 4, &sc, &mn);
          const float d2 = d * float(sc), m2 = dmin * float(mn);
          for (int l = 0; l < 32; ++l) y[j + l] = d1 * float(q[l] & 0x0F) - m1;
          for (int l = 0; l < 32; ++l) y[j + 32 + l] = d2 * float(q[l] >> 4) - m2;
        }
        break;
      }
      case GgmlType::kQ6_K: {
        const uint8_t* ql = blk;
        const uint8_t* qh = blk + 128;
        const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
        const float d = Half(blk + 208);
        for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * float(sc[is]) * float(q1);
            y[l + 32] = d * float(sc[is + 2]) * float(q2);
            y[l + 64] = d * float(sc[is + 4]) * float(q3);
            y[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
        }
        break;
      }
      default:
        for (int j = 0; j < kBlock; ++j) y[j] = Half(blk + 2 * j);
    }
  }
  return out;
}

// n rows of k values of `type`. Q8_0 / Q4_1 come from ggml's quantisers
// applied to uniform values in [-1, 1); the other types get random quants
// (and random Q4_K / Q6_K sub-block scales) and random normal f16 super-scales
// (d, and Q4_K's dmin), never NaN or infinite.
std::vector<uint8_t> RandomWeights(GgmlType type, int n, int k, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  if (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_1) {
    std::vector<float> values(size_t(n) * k);
    for (float& v : values) v = dist(rng);
    return type == GgmlType::kQ8_0 ? testing::QuantizeQ8_0(values) : testing::QuantizeQ4_1(values);
  }
  std::vector<uint8_t> bytes(size_t(n) * k / BlockValues(type) * BlockBytes(type));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& v : bytes) v = uint8_t(byte(rng));
  auto put_half = [](uint8_t* p, float f) {
    const uint16_t h = FloatToHalf(f);
    std::memcpy(p, &h, 2);
  };
  for (size_t off = 0; off < bytes.size(); off += BlockBytes(type)) {
    if (type == GgmlType::kF16) {
      for (int j = 0; j < kBlock; ++j) put_half(&bytes[off + 2 * j], dist(rng));
    } else if (type == GgmlType::kQ4_K) {
      // Sub-block scales up to 63 and quants up to 15: d * 945 at most.
      put_half(&bytes[off], 0.0001f + 0.002f * std::fabs(dist(rng)));      // d
      put_half(&bytes[off + 2], 0.0001f + 0.002f * std::fabs(dist(rng)));  // dmin
    } else if (type == GgmlType::kQ6_K) {
      // |scale * (q - 32)| <= 4096.
      put_half(&bytes[off + 208], 0.00005f + 0.0005f * std::fabs(dist(rng)));
    } else {
      put_half(&bytes[off], 0.001f + 0.1f * std::fabs(dist(rng)));  // the block scale
    }
  }
  return bytes;
}

enum class Mode { kInt8Activations, kF32Activations };

struct Case {
  GgmlType type;
  int m, n, k;
  Mode mode = Mode::kInt8Activations;
};

using MatmulFn = void (*)(const float*, const uint8_t*, GgmlType, int, int, int, float*);

MatmulFn Fast(Mode mode) {
  return mode == Mode::kF32Activations ? cpu::QuantMatmulTransBF32Act : cpu::QuantMatmulTransB;
}

MatmulFn Portable(Mode mode) {
  return mode == Mode::kF32Activations ? cpu::internal::QuantMatmulTransBF32ActPortable
                                       : cpu::internal::QuantMatmulTransBPortable;
}

std::string Name(const Case& c) {
  return std::string(c.mode == Mode::kF32Activations ? "f32act " : "int8act ") +
         GgmlTypeName(c.type) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
         " k=" + std::to_string(c.k);
}

void Check(const Case& c, uint64_t seed) {
  SCOPED_TRACE(Name(c));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(c.m) * c.k);
  for (float& v : x) v = normal(rng);
  // A few large activations, as in real hidden states, widen some blocks' dx.
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
  const std::vector<uint8_t> wq = RandomWeights(c.type, c.n, c.k, rng);
  const size_t row_bytes = size_t(c.k) / BlockValues(c.type) * BlockBytes(c.type);
  std::vector<float> w(size_t(c.n) * c.k);
  for (int i = 0; i < c.n; ++i) {
    const std::vector<float> row = DequantizeRow(c.type, wq.data() + i * row_bytes, c.k);
    std::copy(row.begin(), row.end(), w.begin() + size_t(i) * c.k);
  }

  std::vector<float> got(size_t(c.m) * c.n, std::nanf("")), want(got.size());
  Fast(c.mode)(x.data(), wq.data(), c.type, c.m, c.n, c.k, got.data());
  reference::MatmulTransB(x.data(), w.data(), c.m, c.n, c.k, want.data());

  const bool rounds_activations =
      c.mode == Mode::kInt8Activations && c.type != GgmlType::kF16;
  for (int r = 0; r < c.m; ++r) {
    for (int i = 0; i < c.n; ++i) {
      double bound = 1e-6, abs_dot = 0.0;
      for (int b = 0; b < c.k / kBlock; ++b) {
        double amax = 0.0, wsum = 0.0;
        for (int j = b * kBlock; j < (b + 1) * kBlock; ++j) {
          const double xv = x[size_t(r) * c.k + j], wv = w[size_t(i) * c.k + j];
          amax = std::max(amax, std::fabs(xv));
          wsum += std::fabs(wv);
          abs_dot += std::fabs(xv * wv);
        }
        if (rounds_activations) bound += 1.01 * amax / 254.0 * wsum;
      }
      bound += 1e-5 * abs_dot;
      const size_t idx = size_t(r) * c.n + i;
      ASSERT_NEAR(got[idx], want[idx], bound) << "row " << r << " col " << i;
    }
  }

  // Same bits from the portable path.
  std::vector<float> portable(got.size(), std::nanf(""));
  Portable(c.mode)(x.data(), wq.data(), c.type, c.m, c.n, c.k, portable.data());
  for (size_t idx = 0; idx < got.size(); ++idx) {
    ASSERT_EQ(std::memcmp(&got[idx], &portable[idx], 4), 0)
        << "index " << idx << ": " << got[idx] << " vs " << portable[idx];
  }
}

// SmolLM2's k (576, 1536) for the 32-value types; Gemma 3 270M's (1024 for
// Q4_K attn_output, 2048 for Q6_K ffn_down) for the K types.
std::vector<int> TestKs(GgmlType type) {
  if (IsK(type)) return {256, 1024, 2048};
  return {32, 576, 1536};
}

void CheckAllShapes(GgmlType type, uint64_t seed, Mode mode = Mode::kInt8Activations) {
  for (int m : {1, 2, 5, 16}) {
    for (int k : TestKs(type)) {
      for (int n : {1, 7, 192, 640}) Check({type, m, n, k, mode}, seed++);
    }
  }
}

TEST(QuantMatmulTest, Q4_1MatchesDequantisedReference) { CheckAllShapes(GgmlType::kQ4_1, 100); }
TEST(QuantMatmulTest, Q8_0MatchesDequantisedReference) { CheckAllShapes(GgmlType::kQ8_0, 200); }
TEST(QuantMatmulTest, Q4_0MatchesDequantisedReference) { CheckAllShapes(GgmlType::kQ4_0, 300); }
TEST(QuantMatmulTest, Q5_0MatchesDequantisedReference) { CheckAllShapes(GgmlType::kQ5_0, 400); }
TEST(QuantMatmulTest, F16MatchesDequantisedReference) { CheckAllShapes(GgmlType::kF16, 500); }
TEST(QuantMatmulTest, Q4_KMatchesDequantisedReference) { CheckAllShapes(GgmlType::kQ4_K, 550); }
TEST(QuantMatmulTest, Q6_KMatchesDequantisedReference) { CheckAllShapes(GgmlType::kQ6_K, 580); }

constexpr GgmlType kAllTypes[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0,
                                  GgmlType::kQ5_0, GgmlType::kF16,  GgmlType::kQ4_K,
                                  GgmlType::kQ6_K};

// The smallest k with more than one block: 64, or 512 for the K types.
int TwoBlocks(GgmlType type) { return 2 * BlockValues(type); }

TEST(QuantMatmulTest, EveryTileShape) {
  // Activation-row tails of 1..3 rows and weight-row tails of 1..3 rows.
  uint64_t seed = 600;
  for (GgmlType type : kAllTypes) {
    for (int m : {3, 4, 6, 7}) {
      for (int n : {2, 3, 4, 5, 6, 9}) Check({type, m, n, TwoBlocks(type)}, seed++);
    }
  }
}

TEST(QuantMatmulTest, ZeroActivationsGiveZero) {
  // An all-zero block has dx = 0; it must give 0, not NaN from 0 / 0.
  const int m = 2, n = 3, k = 64;
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> wq = RandomWeights(GgmlType::kQ4_1, n, k, rng);
  std::vector<float> x(size_t(m) * k, 0.0f), y(size_t(m) * n, 1.0f);
  cpu::QuantMatmulTransB(x.data(), wq.data(), GgmlType::kQ4_1, m, n, k, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(QuantMatmulTest, EmptySumIsZero) {
  std::vector<float> y(6, 1.0f);
  cpu::QuantMatmulTransB(nullptr, nullptr, GgmlType::kQ8_0, 2, 3, 0, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

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
  EXPECT_TRUE(cpu::internal::QuantMatmulHasSimd());
#endif
}

// ---- QuantMatmulTransBF32Act

TEST(QuantMatmulF32ActTest, Q4_1MatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kQ4_1, 1100, Mode::kF32Activations);
}
TEST(QuantMatmulF32ActTest, Q8_0MatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kQ8_0, 1200, Mode::kF32Activations);
}
TEST(QuantMatmulF32ActTest, Q4_0MatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kQ4_0, 1300, Mode::kF32Activations);
}
TEST(QuantMatmulF32ActTest, Q5_0MatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kQ5_0, 1400, Mode::kF32Activations);
}
TEST(QuantMatmulF32ActTest, F16MatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kF16, 1500, Mode::kF32Activations);
}
TEST(QuantMatmulF32ActTest, Q4_KMatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kQ4_K, 1550, Mode::kF32Activations);
}
TEST(QuantMatmulF32ActTest, Q6_KMatchesDequantisedReference) {
  CheckAllShapes(GgmlType::kQ6_K, 1580, Mode::kF32Activations);
}

TEST(QuantMatmulF32ActTest, EveryTileShape) {
  // Row counts through the register path (1..4) and the scratch path with
  // every 4-row tail; weight-row counts with every column tail, and more
  // rows than one scratch group holds (at most 30 rows per group).
  uint64_t seed = 1600;
  for (GgmlType type : kAllTypes) {
    for (int m : {1, 2, 3, 4, 5, 6, 7, 8}) {
      for (int n : {1, 2, 3, 4, 5, 6, 9, 33, 70}) {
        Check({type, m, n, TwoBlocks(type), Mode::kF32Activations}, seed++);
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
      const int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      cpu::QuantMatmulTransBF32Act(x.data(), wq.data(), type, m, n, k, y1.data());
      omp_set_num_threads(2);
      cpu::QuantMatmulTransBF32Act(x.data(), wq.data(), type, m, n, k, y2.data());
      omp_set_num_threads(saved);
      ExpectSameBits(y2, y1);
    }
  }
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
  cpu::QuantMatmulTransB(x.data(), wq.data(), GgmlType::kQ4_1, m, n, k, int8act.data());
  double err_f32 = 0.0, err_int8 = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    err_f32 = std::max(err_f32, double(std::fabs(f32act[i] - exact[i])));
    err_int8 = std::max(err_int8, double(std::fabs(int8act[i] - exact[i])));
  }
  EXPECT_LT(err_f32 * 100.0, err_int8) << err_f32 << " vs " << err_int8;
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
  EXPECT_DEATH(cpu::QuantMatmulTransB(x.data(), w.data(), GgmlType::kQ5_K, 1, 1, 256, y.data()),
               "QuantMatmulSupported");
  EXPECT_DEATH(cpu::QuantMatmulTransB(x.data(), w.data(), GgmlType::kQ8_0, 1, 1, 31, y.data()),
               "k % BlockValues");
  // K types need whole 256-value super-blocks.
  EXPECT_DEATH(cpu::QuantMatmulTransB(x.data(), w.data(), GgmlType::kQ4_K, 1, 1, 32, y.data()),
               "k % BlockValues");
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
