// llama.cpp's 8-bit-activation quantised matrix product; the method is in
// kernels/reference/quant_matmul_8bit_act.h, the block layouts in
// kernels/quant_matmul.h.
//
// Summation order, shared by the AVX2 and the portable path so that both give
// the same bits: a block's 32 products fall into 8 lanes (lane l holds values
// 4l..4l+3 for the 8-bit dot, values l, l+8, l+16, l+24 for F16), each lane is
// an exact integer (or one FMA per value for F16), lane l of the accumulator
// takes one FMA per block, and the 8 lanes are reduced as
// ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) before the offset term (sum of m*sx
// over blocks, one FMA per block) is added. Integer dots cannot overflow or
// saturate: |qw| <= 128 (Q8_0; 31 for Q5_0, 32 for Q6_K), |qx| <= 127, so a
// 16-bit pair sum is at most 2*128*127 = 32512.
//
// The K types are taken one 32-value sub-block (one activation block) at a
// time, with the integer method as for the 32-value types: Q4_K sub-block j
// is a Q4_1-like block with scale d*sc_j and offset -dmin*m_j (both exact in
// f32: an 11-bit by 6-bit product); Q6_K sub-blocks hold signed q - 32 in
// [-32, 31] with one scale per 16 values, so each 4-value lane's integer sum
// (|.| <= 4*32*127) is multiplied by its scale (|sc| <= 128) as an integer
// (|.| <= 2080768 < 2^24, exact in f32) before the block's one FMA with
// d*dx.
#include "kernels/reference/quant_matmul_8bit_act.h"

#include "kernels/quant_blocks.h"
#include "kernels/quant_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HEADWAY_QMM_AVX2 1
#endif

#include "common/status.h"

namespace headway::reference {
namespace {

using quant::BlockBytes;
using quant::BlockValues;
using quant::HalfToFloat;
using quant::kQ4KQs;
using quant::kQ4KScales;
using quant::kQ6KD;
using quant::kQ6KQh;
using quant::kQ6KScales;
using quant::LoadU16;
using quant::ScaleMinK4;

// Values per activation block and per weight block or K sub-block.
constexpr int kBlock = 32;
constexpr int kLanes = 8;     // f32 accumulator lanes per output
constexpr int kRowTile = 4;   // activation rows sharing one unpacked weight block
constexpr int kColGroup = 4;  // weight rows per unit of work shared out to threads
// Below this many weights per call, starting threads costs more than it saves.
constexpr int64_t kMinWeightsForThreads = int64_t{1} << 15;

// Activation rows quantised to 8-bit blocks (ggml's block_q8_1, f32 scales).
struct ActivationBlocks {
  std::vector<int8_t> qs;  // [m, k]
  std::vector<float> d;    // [m, blocks_per_row]: max|x| / 127
  std::vector<float> s;    // [m, blocks_per_row]: d * sum(qs)
};

// Quantises block `b` (counted over all rows) of x; the rounding is
// round-half-even, as _mm256_round_ps and ggml's quantize_row_q8_1.
void QuantizeBlockPortable(const float* x, ActivationBlocks* a, int64_t b) {
  const float* xb = x + b * kBlock;
  float amax = 0.0f;
  for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int8_t* q = a->qs.data() + b * kBlock;
  int sum = 0;
  for (int j = 0; j < kBlock; ++j) {
    q[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
    sum += q[j];
  }
  a->d[b] = d;
  a->s[b] = d * static_cast<float>(sum);
}

// A weight block (or K sub-block) unpacked to 32 integers q with
// w_j = scale * lane_scale[j / 4] * q_j + offset, so that the block's product
// with an activation block is
// scale*dx*sum_l(lane_scale[l] * dot_l(q, qx)) + offset*sx (Q4_0: offset =
// -8*scale; Q5_0: -16*scale; lane_scale is 1 but for Q6_K).
struct WeightBlockPortable {
  int q[kBlock];
  int lane_scale[kLanes];
  float scale;
  float offset;
};

// Sub-block `s` (0 but for the K types, 0..7) of block `blk`.
void UnpackPortable(GgmlType type, const uint8_t* blk, int s, WeightBlockPortable* w) {
  w->scale = HalfToFloat(LoadU16(blk));
  w->offset = 0.0f;
  for (int l = 0; l < kLanes; ++l) w->lane_scale[l] = 1;
  switch (type) {
    case GgmlType::kQ8_0: {
      const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
      for (int j = 0; j < kBlock; ++j) w->q[j] = qs[j];
      break;
    }
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: {
      const uint8_t* qs = blk + (type == GgmlType::kQ4_0 ? 2 : 4);
      for (int j = 0; j < kBlock / 2; ++j) {
        w->q[j] = qs[j] & 0x0F;
        w->q[j + kBlock / 2] = qs[j] >> 4;
      }
      w->offset = type == GgmlType::kQ4_0 ? -8.0f * w->scale : HalfToFloat(LoadU16(blk + 2));
      break;
    }
    case GgmlType::kQ5_0: {
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      const uint8_t* qs = blk + 6;
      for (int j = 0; j < kBlock / 2; ++j) {
        w->q[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
        w->q[j + kBlock / 2] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      }
      w->offset = -16.0f * w->scale;
      break;
    }
    case GgmlType::kQ4_K: {
      int sc = 0, mn = 0;
      ScaleMinK4(s, blk + kQ4KScales, &sc, &mn);
      const uint8_t* qs = blk + kQ4KQs + 32 * (s / 2);
      for (int j = 0; j < kBlock; ++j) w->q[j] = (qs[j] >> (4 * (s & 1))) & 0x0F;
      w->offset = -(HalfToFloat(LoadU16(blk + 2)) * static_cast<float>(mn));
      w->scale *= static_cast<float>(sc);
      break;
    }
    case GgmlType::kQ6_K: {
      // Layout as in DequantBlockPortable of quant_matmul_f32act.cc.
      const int h = s / 4, g = s % 4;
      const uint8_t* ql = blk + 64 * h + 32 * (g & 1);
      const uint8_t* qh = blk + kQ6KQh + 32 * h;
      for (int j = 0; j < kBlock; ++j) {
        w->q[j] = (((ql[j] >> (4 * (g >> 1))) & 0x0F) | (((qh[j] >> (2 * g)) & 3) << 4)) - 32;
      }
      const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6KScales) + 8 * h + 2 * g;
      for (int l = 0; l < kLanes; ++l) w->lane_scale[l] = scales[l / 4];
      w->scale = HalfToFloat(LoadU16(blk + kQ6KD));
      break;
    }
    default: break;
  }
}

float ReduceLanes(const float* a) {
  const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
  return (t0 + t2) + (t1 + t3);
}

// y[r, i] for every activation row r, weight row i (portable).
void RowPortable(GgmlType type, const float* x, const ActivationBlocks& a, const uint8_t* w_row,
                 int m, int n, int k, int i, float* y) {
  const int nb = k / kBlock;
  const int block_bytes = BlockBytes(type);
  const int chunks = BlockValues(type) / kBlock;
  for (int r = 0; r < m; ++r) {
    float acc[kLanes] = {};
    float offset_sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const uint8_t* blk = w_row + size_t(b / chunks) * block_bytes;
      if (type == GgmlType::kF16) {
        const float* xb = x + size_t(r) * k + size_t(b) * kBlock;
        for (int t = 0; t < kBlock / kLanes; ++t) {
          for (int l = 0; l < kLanes; ++l) {
            const int j = t * kLanes + l;
            acc[l] = std::fma(HalfToFloat(LoadU16(blk + 2 * j)), xb[j], acc[l]);
          }
        }
        continue;
      }
      WeightBlockPortable w;
      UnpackPortable(type, blk, b % chunks, &w);
      const size_t ab = size_t(r) * nb + b;
      const int8_t* qx = a.qs.data() + ab * kBlock;
      const float dd = w.scale * a.d[ab];
      for (int l = 0; l < kLanes; ++l) {
        int lane = 0;
        for (int j = 4 * l; j < 4 * l + 4; ++j) lane += w.q[j] * qx[j];
        acc[l] = std::fma(dd, static_cast<float>(lane * w.lane_scale[l]), acc[l]);
      }
      offset_sum = std::fma(w.offset, a.s[ab], offset_sum);
    }
    y[size_t(r) * n + i] = ReduceLanes(acc) + offset_sum;
  }
}

#ifdef HEADWAY_QMM_AVX2

void QuantizeBlockAvx2(const float* x, ActivationBlocks* a, int64_t b) {
  const float* xb = x + b * kBlock;
  __m256 v[4];
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int t = 0; t < 4; ++t) {
    v[t] = _mm256_loadu_ps(xb + 8 * t);
    vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v[t]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i qi[4];
  for (int t = 0; t < 4; ++t) {
    qi[t] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(v[t], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Exact integer sum of the 32 values.
  __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  const int sum = _mm_cvtsi128_si32(s4);
  // Pack 32 x i32 to 32 x i8; packs interleave 128-bit halves, the permute
  // restores value order.
  const __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]);
  const __m256i p23 = _mm256_packs_epi32(qi[2], qi[3]);
  const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a->qs.data() + b * kBlock), p);
  a->d[b] = d;
  a->s[b] = d * static_cast<float>(sum);
}

inline float HalfToFloatAvx2(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

inline float ReduceLanesAvx2(__m256 acc) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// 32 nibbles of a 4-bit block as bytes: low nibbles first, then high.
inline __m256i NibblesToBytes(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Byte j = 0x10 where bit j of the little-endian u32 at `qh` is set.
inline __m256i HighBitsToBytes(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Weight block `blk` (sub-block s of it for the K types) unpacked for the
// 8-bit dot: `q` holds unsigned bytes (|q| for Q8_0 and Q6_K, whose signs are
// in `q_signed`); `lane_scale` is Q6_K's integer scale per 4-value lane.
struct WeightBlockAvx2 {
  __m256i q;
  __m256i q_signed;
  __m256i lane_scale;
  float scale;
  float offset;
};

template <GgmlType kType>
inline WeightBlockAvx2 UnpackAvx2(const uint8_t* blk, int s) {
  WeightBlockAvx2 w;
  if constexpr (kType != GgmlType::kQ4_1 && kType != GgmlType::kQ4_K &&
                kType != GgmlType::kQ6_K) {
    w.scale = HalfToFloatAvx2(blk);
  }
  w.offset = 0.0f;
  w.q_signed = _mm256_setzero_si256();
  if constexpr (kType == GgmlType::kQ8_0) {
    w.q_signed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    w.q = _mm256_sign_epi8(w.q_signed, w.q_signed);
  } else if constexpr (kType == GgmlType::kQ4_0) {
    w.q = NibblesToBytes(blk + 2);
    w.offset = -8.0f * w.scale;
  } else if constexpr (kType == GgmlType::kQ4_1) {
    w.q = NibblesToBytes(blk + 4);
    // d and m converted together.
    uint32_t dm_bits;
    std::memcpy(&dm_bits, blk, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm_bits)));
    w.scale = _mm_cvtss_f32(dm);
    w.offset = _mm_cvtss_f32(_mm_movehdup_ps(dm));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    w.q = _mm256_or_si256(NibblesToBytes(blk + 6), HighBitsToBytes(blk + 2));
    w.offset = -16.0f * w.scale;
  } else if constexpr (kType == GgmlType::kQ4_K) {
    uint32_t dm_bits;
    std::memcpy(&dm_bits, blk, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm_bits)));
    int sc = 0, mn = 0;
    ScaleMinK4(s, blk + kQ4KScales, &sc, &mn);
    w.scale = _mm_cvtss_f32(dm) * static_cast<float>(sc);
    w.offset = -(_mm_cvtss_f32(_mm_movehdup_ps(dm)) * static_cast<float>(mn));
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ4KQs + 32 * (s >> 1)));
    w.q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(4 * (s & 1))),
                           _mm256_set1_epi8(0x0F));
  } else {  // Q6_K
    const int h = s >> 2, g = s & 3;
    const __m256i ql =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (g & 1)));
    const __m256i qh =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6KQh + 32 * h));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g >> 1))),
                                        _mm256_set1_epi8(0x0F));
    // Masked to 2 bits per byte first, so the 16-bit shift left stays in its byte.
    const __m256i hi = _mm256_slli_epi16(
        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3)), 4);
    w.q_signed = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
    w.q = _mm256_sign_epi8(w.q_signed, w.q_signed);
    const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6KScales) + 8 * h + 2 * g;
    w.lane_scale = _mm256_set_m128i(_mm_set1_epi32(scales[1]), _mm_set1_epi32(scales[0]));
    w.scale = HalfToFloatAvx2(blk + kQ6KD);
  }
  return w;
}

// Outputs y[r0 + r, i0 + c] for r in [0, R), c in [0, C): C weight rows
// against R activation rows, so that each unpacked weight block serves R rows
// and C * R independent accumulators hide the FMA latency.
template <GgmlType kType, int R, int C>
void TileAvx2(const float* x, const ActivationBlocks& a, const uint8_t* w, size_t row_bytes,
              int r0, int i0, int n, int k, float* y) {
  const int nb = k / kBlock;
  constexpr int kBytes = BlockBytes(kType);
  constexpr int kChunks = BlockValues(kType) / kBlock;
  constexpr bool kHasOffset = kType == GgmlType::kQ4_0 || kType == GgmlType::kQ4_1 ||
                              kType == GgmlType::kQ5_0 || kType == GgmlType::kQ4_K;
  constexpr bool kSigned = kType == GgmlType::kQ8_0 || kType == GgmlType::kQ6_K;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C];
  float offset_sum[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      offset_sum[r][c] = 0.0f;
    }
  }
  const uint8_t* rows[C];
  for (int c = 0; c < C; ++c) rows[c] = w + size_t(i0 + c) * row_bytes;
  for (int b = 0; b < nb; ++b) {
    if constexpr (kType == GgmlType::kF16) {
      for (int c = 0; c < C; ++c) {
        const uint8_t* blk = rows[c] + size_t(b) * kBytes;
        __m256 wv[4];
        for (int t = 0; t < 4; ++t) {
          wv[t] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * t)));
        }
        for (int r = 0; r < R; ++r) {
          const float* xb = x + size_t(r0 + r) * k + size_t(b) * kBlock;
          for (int t = 0; t < 4; ++t) {
            acc[r][c] = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(xb + 8 * t), acc[r][c]);
          }
        }
      }
    } else {
      WeightBlockAvx2 wb[C];
      __m256 scale[C];
      for (int c = 0; c < C; ++c) {
        wb[c] = UnpackAvx2<kType>(rows[c] + size_t(b / kChunks) * kBytes, b % kChunks);
        scale[c] = _mm256_set1_ps(wb[c].scale);
      }
      for (int r = 0; r < R; ++r) {
        const size_t ab = size_t(r0 + r) * nb + b;
        const __m256i qx =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs.data() + ab * kBlock));
        // A broadcast load; scale * dx rounds as the portable path's product.
        const __m256 dx = _mm256_broadcast_ss(&a.d[ab]);
        const float sx = a.s[ab];
        for (int c = 0; c < C; ++c) {
          __m256i p16;
          if constexpr (kSigned) {
            p16 = _mm256_maddubs_epi16(wb[c].q, _mm256_sign_epi8(qx, wb[c].q_signed));
          } else {
            p16 = _mm256_maddubs_epi16(wb[c].q, qx);
          }
          __m256i p32 = _mm256_madd_epi16(p16, ones);
          if constexpr (kType == GgmlType::kQ6_K) p32 = _mm256_mullo_epi32(p32, wb[c].lane_scale);
          const __m256 lanes = _mm256_cvtepi32_ps(p32);
          acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(scale[c], dx), lanes, acc[r][c]);
          if constexpr (kHasOffset) offset_sum[r][c] = std::fma(wb[c].offset, sx, offset_sum[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      y[size_t(r0 + r) * n + i0 + c] = ReduceLanesAvx2(acc[r][c]) + offset_sum[r][c];
    }
  }
}

// Outputs y[:, i0 .. i0 + C) for all m activation rows.
template <GgmlType kType, int C>
void ColumnsAvx2(const float* x, const ActivationBlocks& a, const uint8_t* w, size_t row_bytes,
                 int m, int i0, int n, int k, float* y) {
  int r0 = 0;
  for (; r0 + kRowTile <= m; r0 += kRowTile) {
    TileAvx2<kType, kRowTile, C>(x, a, w, row_bytes, r0, i0, n, k, y);
  }
  switch (m - r0) {
    case 3: TileAvx2<kType, 3, C>(x, a, w, row_bytes, r0, i0, n, k, y); break;
    case 2: TileAvx2<kType, 2, C>(x, a, w, row_bytes, r0, i0, n, k, y); break;
    case 1: TileAvx2<kType, 1, C>(x, a, w, row_bytes, r0, i0, n, k, y); break;
    default: break;
  }
}

// Outputs y[:, i_begin .. i_end), i_end - i_begin <= kColGroup: 4 weight rows
// at a time for one or two activation rows (few accumulators otherwise),
// 2 at a time for more.
template <GgmlType kType>
void GroupAvx2(const float* x, const ActivationBlocks& a, const uint8_t* w, size_t row_bytes,
               int m, int i_begin, int i_end, int n, int k, float* y) {
  int i = i_begin;
  if (m <= 2) {
    for (; i + 4 <= i_end; i += 4) ColumnsAvx2<kType, 4>(x, a, w, row_bytes, m, i, n, k, y);
  }
  for (; i + 2 <= i_end; i += 2) ColumnsAvx2<kType, 2>(x, a, w, row_bytes, m, i, n, k, y);
  for (; i < i_end; ++i) ColumnsAvx2<kType, 1>(x, a, w, row_bytes, m, i, n, k, y);
}

void GroupAvx2(GgmlType type, const float* x, const ActivationBlocks& a, const uint8_t* w,
               size_t row_bytes, int m, int i_begin, int i_end, int n, int k, float* y) {
  switch (type) {
    case GgmlType::kQ8_0:
      GroupAvx2<GgmlType::kQ8_0>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    case GgmlType::kQ4_0:
      GroupAvx2<GgmlType::kQ4_0>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    case GgmlType::kQ4_1:
      GroupAvx2<GgmlType::kQ4_1>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    case GgmlType::kQ5_0:
      GroupAvx2<GgmlType::kQ5_0>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    case GgmlType::kF16:
      GroupAvx2<GgmlType::kF16>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    case GgmlType::kQ4_K:
      GroupAvx2<GgmlType::kQ4_K>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    case GgmlType::kQ6_K:
      GroupAvx2<GgmlType::kQ6_K>(x, a, w, row_bytes, m, i_begin, i_end, n, k, y);
      break;
    default: break;
  }
}

#endif  // HEADWAY_QMM_AVX2

void Run(bool simd, const float* x, const uint8_t* w_quant, GgmlType w_type, int m, int n, int k,
         float* y) {
  HW_CHECK(cpu::QuantMatmulSupported(w_type));
  HW_CHECK(m >= 0 && n >= 0 && k >= 0 && k % BlockValues(w_type) == 0);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + size_t(m) * n, 0.0f);
    return;
  }
#ifndef HEADWAY_QMM_AVX2
  simd = false;
#endif
  const bool quantise = w_type != GgmlType::kF16;
  const int nb = k / kBlock;
  const int64_t total_blocks = quantise ? int64_t{m} * nb : 0;
  ActivationBlocks a;
  a.qs.resize(size_t(total_blocks) * kBlock);
  a.d.resize(total_blocks);
  a.s.resize(total_blocks);
  const size_t row_bytes = size_t(k / BlockValues(w_type)) * BlockBytes(w_type);
  const bool threads = int64_t{n} * k >= kMinWeightsForThreads;
  const int num_groups = (n + kColGroup - 1) / kColGroup;

#pragma omp parallel if (threads)
  {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < total_blocks; ++b) {
#ifdef HEADWAY_QMM_AVX2
      if (simd) {
        QuantizeBlockAvx2(x, &a, b);
        continue;
      }
#endif
      QuantizeBlockPortable(x, &a, b);
    }
    // The implicit barrier above publishes every activation block.
#pragma omp for schedule(static)
    for (int g = 0; g < num_groups; ++g) {
      const int i_begin = g * kColGroup, i_end = std::min(n, i_begin + kColGroup);
#ifdef HEADWAY_QMM_AVX2
      if (simd) {
        GroupAvx2(w_type, x, a, w_quant, row_bytes, m, i_begin, i_end, n, k, y);
        continue;
      }
#endif
      for (int i = i_begin; i < i_end; ++i) {
        RowPortable(w_type, x, a, w_quant + size_t(i) * row_bytes, m, n, k, i, y);
      }
    }
  }
}

}  // namespace

void QuantMatmulTransB8BitAct(const float* x, const uint8_t* w_quant, GgmlType w_type, int m,
                              int n, int k, float* y) {
  Run(/*simd=*/true, x, w_quant, w_type, m, n, k, y);
}

namespace internal {

void QuantMatmulTransB8BitActPortable(const float* x, const uint8_t* w_quant, GgmlType w_type,
                                      int m, int n, int k, float* y) {
  Run(/*simd=*/false, x, w_quant, w_type, m, n, k, y);
}

bool QuantMatmul8BitActHasSimd() {
#ifdef HEADWAY_QMM_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace internal
}  // namespace headway::reference
