// Shared by the quantised matmul tests (quant_matmul_test.cc for the serving
// kernel, quant_matmul_8bit_act_test.cc for llama.cpp's 8-bit-activation
// reference): random weights in every block type, an independent dequantiser,
// and the check of a kernel against the double-accumulating reference applied
// to the dequantised weights (tolerances in each test file's header).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "kernels/reference/reference.h"
#include "tests/support/gguf_writer.h"

namespace headway::testing {

constexpr int kBlock = 32;

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  // IEEE half: no inf / NaN arise in these tests.
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(float(mant), -24);
  return sign * std::ldexp(float(mant | 0x400), exp - 25);
}

inline bool IsK(GgmlType type) { return type == GgmlType::kQ4_K || type == GgmlType::kQ6_K; }

inline int BlockValues(GgmlType type) { return IsK(type) ? 256 : kBlock; }

inline int BlockBytes(GgmlType type) {
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
inline void ScaleMinK4(int j, const uint8_t* q, int* sc, int* mn) {
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
inline std::vector<float> DequantizeRow(GgmlType type, const uint8_t* row, int k) {
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
inline std::vector<uint8_t> RandomWeights(GgmlType type, int n, int k, std::mt19937_64& rng) {
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

using MatmulFn = void (*)(const float*, const uint8_t*, GgmlType, int, int, int, float*);

// A quantised matmul under test: its fast and portable paths (which must give
// the same bits) and whether it rounds activations to 8-bit blocks (F16
// weights never do), which widens the tolerance.
struct QuantKernel {
  const char* name;
  MatmulFn fast;
  MatmulFn portable;
  bool rounds_activations;
};

struct Case {
  GgmlType type;
  int m, n, k;
};

inline std::string Name(const QuantKernel& kernel, const Case& c) {
  return std::string(kernel.name) + " " + GgmlTypeName(c.type) + " m=" + std::to_string(c.m) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k);
}

inline void Check(const QuantKernel& kernel, const Case& c, uint64_t seed) {
  SCOPED_TRACE(Name(kernel, c));
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
  kernel.fast(x.data(), wq.data(), c.type, c.m, c.n, c.k, got.data());
  reference::MatmulTransB(x.data(), w.data(), c.m, c.n, c.k, want.data());

  const bool rounds_activations = kernel.rounds_activations && c.type != GgmlType::kF16;
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
  kernel.portable(x.data(), wq.data(), c.type, c.m, c.n, c.k, portable.data());
  for (size_t idx = 0; idx < got.size(); ++idx) {
    ASSERT_EQ(std::memcmp(&got[idx], &portable[idx], 4), 0)
        << "index " << idx << ": " << got[idx] << " vs " << portable[idx];
  }
}

// SmolLM2's k (576, 1536) for the 32-value types; Gemma 3 270M's (1024 for
// Q4_K attn_output, 2048 for Q6_K ffn_down) for the K types.
inline std::vector<int> TestKs(GgmlType type) {
  if (IsK(type)) return {256, 1024, 2048};
  return {32, 576, 1536};
}

inline void CheckAllShapes(const QuantKernel& kernel, GgmlType type, uint64_t seed) {
  for (int m : {1, 2, 5, 16}) {
    for (int k : TestKs(type)) {
      for (int n : {1, 7, 192, 640}) Check(kernel, {type, m, n, k}, seed++);
    }
  }
}

constexpr GgmlType kAllTypes[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0,
                                  GgmlType::kQ5_0, GgmlType::kF16,  GgmlType::kQ4_K,
                                  GgmlType::kQ6_K};

// The smallest k with more than one block: 64, or 512 for the K types.
inline int TwoBlocks(GgmlType type) { return 2 * BlockValues(type); }

}  // namespace headway::testing
