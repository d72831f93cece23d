// QuantMatmulTransBF32Act: quantised weights against f32 activations; the
// contract and the summation order are in kernels/quant_matmul.h.
//
// Two AVX2 strategies, chosen by m, that give the same bits because each
// output's FMA sequence is the same in both:
//   - m <= kRegisterPathMaxRows (decode): each weight block is dequantised in
//     registers and FMA'd straight into the (up to 4) activation rows; weight
//     bytes are read once and nothing is written but y.
//   - larger m (prefill): a group of weight rows is dequantised once into an
//     f32 scratch that stays in L2, then swept by 4-row x 3-column tiles of
//     outputs (12 accumulators keep both FMA pipes busy), so the
//     dequantisation cost is shared by all m rows.
// The portable path dequantises a weight row into a scratch row and runs the
// same lanes with std::fma, so it agrees bit for bit with the AVX2 path.
// Q4_K and Q6_K super-blocks have their sub-block scales unpacked once per
// block and weight row (KScales), then are dequantised 32 values (one
// sub-block) at a time, in value order, so their FMA order is the header's.
#include "kernels/quant_matmul.h"

#include "kernels/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HEADWAY_QMM_F32ACT_AVX2 1
#endif

#include "common/status.h"

namespace headway::cpu {
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

constexpr int kChunk = 32;     // values dequantised together (a K super-block has 8)
constexpr int kLanes = 8;      // f32 lanes per output accumulator
constexpr int kColGroup = 4;   // weight rows per unit of work, register path
constexpr int kRegisterPathMaxRows = 4;
// f32 scratch per thread for the prefill path: 192 KiB (at least 3 rows),
// inside L2, and enough weight rows per group that x is streamed few times.
constexpr int kScratchFloats = 48 * 1024;
constexpr int kMaxScratchRows = 30;
// Below this many weights per call, starting threads costs more than it saves.
constexpr int64_t kMinWeightsForThreads = int64_t{1} << 15;

// Weight rows dequantised per group in the prefill path: as many as fit the
// scratch, a multiple of 3 (the tiles take 3 columns), at least 3.
int ScratchRows(int k) {
  return std::clamp(kScratchFloats / k / 3 * 3, 3, kMaxScratchRows);
}

// One block's BlockValues(type) weights, rounded as the header states.
void DequantBlockPortable(GgmlType type, const uint8_t* blk, float* w) {
  constexpr int kBlock = 32;
  const float d = HalfToFloat(LoadU16(blk));
  switch (type) {
    case GgmlType::kQ8_0: {
      const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
      for (int j = 0; j < kBlock; ++j) w[j] = d * static_cast<float>(qs[j]);
      break;
    }
    case GgmlType::kQ4_0: {
      const uint8_t* qs = blk + 2;
      for (int j = 0; j < kBlock / 2; ++j) {
        w[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
        w[j + kBlock / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
      }
      break;
    }
    case GgmlType::kQ4_1: {
      const float mn = HalfToFloat(LoadU16(blk + 2));
      const uint8_t* qs = blk + 4;
      for (int j = 0; j < kBlock / 2; ++j) {
        w[j] = std::fma(d, static_cast<float>(qs[j] & 0x0F), mn);
        w[j + kBlock / 2] = std::fma(d, static_cast<float>(qs[j] >> 4), mn);
      }
      break;
    }
    case GgmlType::kQ5_0: {
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      const uint8_t* qs = blk + 6;
      for (int j = 0; j < kBlock / 2; ++j) {
        const int lo = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        w[j] = d * static_cast<float>(lo - 16);
        w[j + kBlock / 2] = d * static_cast<float>(hi - 16);
      }
      break;
    }
    case GgmlType::kF16:
      for (int j = 0; j < kBlock; ++j) w[j] = HalfToFloat(LoadU16(blk + 2 * j));
      break;
    case GgmlType::kQ4_K: {
      // Sub-block s: values 32s .. 32s+31 from the low (s even) or high
      // (s odd) nibbles of qs[32 * (s / 2) ..].
      const float dmin = HalfToFloat(LoadU16(blk + 2));
      for (int s = 0; s < 8; ++s) {
        int sc = 0, mn = 0;
        ScaleMinK4(s, blk + kQ4KScales, &sc, &mn);
        const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
        const uint8_t* qs = blk + kQ4KQs + 32 * (s / 2);
        const int shift = 4 * (s & 1);
        for (int l = 0; l < 32; ++l) {
          w[32 * s + l] = std::fma(d1, static_cast<float>((qs[l] >> shift) & 0x0F), -m1);
        }
      }
      break;
    }
    case GgmlType::kQ6_K: {
      // Half h (128 values), quarter g: low 4 bits from the low (g < 2) or
      // high nibbles of ql[64h + 32(g % 2) ..], top 2 bits from bits 2g, 2g+1
      // of qh[32h ..]; one scale per 16 values.
      const float d6 = HalfToFloat(LoadU16(blk + kQ6KD));
      const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6KScales);
      for (int s = 0; s < 8; ++s) {
        const int h = s / 4, g = s % 4;
        const uint8_t* ql = blk + 64 * h + 32 * (g & 1);
        const uint8_t* qh = blk + kQ6KQh + 32 * h;
        for (int l = 0; l < 32; ++l) {
          const int q = (((ql[l] >> (4 * (g >> 1))) & 0x0F) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
          w[32 * s + l] =
              (d6 * static_cast<float>(scales[8 * h + 2 * g + l / 16])) * static_cast<float>(q);
        }
      }
      break;
    }
    default: break;
  }
}

float ReduceLanes(const float* a) {
  const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
  return (t0 + t2) + (t1 + t3);
}

// y[r, i] = x[r, :] . w for one dequantised weight row w and all m rows.
void RowPortable(const float* x, const float* w, int m, int n, int k, int i, float* y) {
  for (int r = 0; r < m; ++r) {
    const float* xr = x + size_t(r) * k;
    float acc[kLanes] = {};
    for (int u = 0; u < k; u += kLanes) {
      for (int l = 0; l < kLanes; ++l) acc[l] = std::fma(w[u + l], xr[u + l], acc[l]);
    }
    y[size_t(r) * n + i] = ReduceLanes(acc);
  }
}

#ifdef HEADWAY_QMM_F32ACT_AVX2

// Lanes reduced as ReduceLanes.
inline float ReduceLanesAvx2(__m256 acc) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

inline __m256i LoadBytesU32(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The per-sub-block factors of one K super-block, unpacked once per block
// and weight row and shared by its 8 sub-blocks: Q4_K scale[s] = d*sc_s,
// offset[s] = -(dmin*m_s); Q6_K scale[t] = d*sc_t for its 16 scales. Each
// is an exact product, equal to DequantBlockPortable's.
struct KScales {
  alignas(32) float scale[16];
  alignas(32) float offset[8];
};

template <GgmlType kType>
inline void UnpackKScalesAvx2(const uint8_t* blk, KScales* ks) {
  if constexpr (kType == GgmlType::kQ4_K) {
    // get_scale_min_k4 for all 8 sub-blocks at once, 4 bytes per step: bytes
    // 0..3 hold sc_0..3 and (top bits) sc_4..7's high bits, bytes 4..7 the
    // same for the mins, bytes 8..11 the low nibbles of sc_4..7 / m_4..7.
    uint32_t u[3];
    std::memcpy(u, blk + kQ4KScales, 12);
    const uint32_t sc_lo = u[0] & 0x3F3F3F3Fu;
    const uint32_t mn_lo = u[1] & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0)));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_setr_epi32(static_cast<int>(mn_lo), static_cast<int>(mn_hi), 0, 0)));
    uint32_t dm_bits;
    std::memcpy(&dm_bits, blk, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm_bits)));
    const __m256 d = _mm256_broadcastss_ps(dm);
    const __m256 dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    _mm256_store_ps(ks->scale, _mm256_mul_ps(d, sc));
    // Negated after the product, as the portable path.
    _mm256_store_ps(ks->offset, _mm256_xor_ps(_mm256_mul_ps(dmin, mn), _mm256_set1_ps(-0.0f)));
  } else {  // Q6_K
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(LoadU16(blk + kQ6KD)));
    for (int half = 0; half < 2; ++half) {
      const __m256i sc = _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + kQ6KScales + 8 * half)));
      _mm256_store_ps(ks->scale + 8 * half, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
    }
  }
}

// 32 signed bytes as q[t] = bytes 8t .. 8t+7 widened to i32.
inline void WidenBytes(__m256i v, __m256i q[4]) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  q[0] = _mm256_cvtepi8_epi32(lo);
  q[1] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo));
  q[2] = _mm256_cvtepi8_epi32(hi);
  q[3] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi));
}

// Weights 32S .. 32S+31 of K super-block `blk` (sub-block S) as w[t] =
// values 32S + 8t .. 32S + 8t + 7, rounded as DequantBlockPortable. Two
// ways to unpack Q6_K's bits, the same values: kWideLoads widens each group
// of 8 bytes as it is loaded (faster with 3 or 4 activation rows), otherwise
// all 32 are combined as bytes and widened after (faster with 1 or 2).
template <GgmlType kType, int S, bool kWideLoads>
inline void DequantSubBlockAvx2(const uint8_t* blk, const KScales& ks, __m256 w[4]) {
  if constexpr (kType == GgmlType::kQ4_K) {
    const __m256 d1 = _mm256_broadcast_ss(&ks.scale[S]);
    const __m256 neg_m1 = _mm256_broadcast_ss(&ks.offset[S]);
    const uint8_t* qs = blk + kQ4KQs + 32 * (S / 2);
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (int t = 0; t < 4; ++t) {
      const __m256i q =
          _mm256_and_si256(_mm256_srli_epi32(LoadBytesU32(qs + 8 * t), 4 * (S & 1)), low);
      w[t] = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(q), neg_m1);
    }
  } else {  // Q6_K
    constexpr int h = S / 4, g = S % 4;
    const uint8_t* ql = blk + 64 * h + 32 * (g & 1);
    const uint8_t* qh = blk + kQ6KQh + 32 * h;
    const __m256 scale[2] = {_mm256_broadcast_ss(&ks.scale[8 * h + 2 * g]),
                             _mm256_broadcast_ss(&ks.scale[8 * h + 2 * g + 1])};
    __m256i q[4];
    if constexpr (kWideLoads) {
      const __m256i low = _mm256_set1_epi32(0x0F), two_bits = _mm256_set1_epi32(3);
      for (int t = 0; t < 4; ++t) {
        const __m256i lo =
            _mm256_and_si256(_mm256_srli_epi32(LoadBytesU32(ql + 8 * t), 4 * (g >> 1)), low);
        const __m256i hi =
            _mm256_and_si256(_mm256_srli_epi32(LoadBytesU32(qh + 8 * t), 2 * g), two_bits);
        q[t] = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                _mm256_set1_epi32(32));
      }
    } else {
      const __m256i lo = _mm256_and_si256(
          _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql)), 4 * (g >> 1)),
          _mm256_set1_epi8(0x0F));
      // Masked to 2 bits per byte before the 16-bit shift left, so no bit
      // crosses into the next byte.
      const __m256i hi = _mm256_slli_epi16(
          _mm256_and_si256(
              _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)), 2 * g),
              _mm256_set1_epi8(3)),
          4);
      WidenBytes(_mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32)), q);
    }
    for (int t = 0; t < 4; ++t) w[t] = _mm256_mul_ps(scale[t >> 1], _mm256_cvtepi32_ps(q[t]));
  }
}

// f(std::integral_constant<int, S>) for S = 0 .. 7 in order, S a constant
// in each call so that sub-block offsets and shifts are immediates.
template <class F>
inline void ForEachSubBlock(F&& f) {
  [&]<int... S>(std::integer_sequence<int, S...>) {
    (f(std::integral_constant<int, S>{}), ...);
  }(std::make_integer_sequence<int, 8>{});
}

// The 32 weights of `blk` (a 32-value type) as w[t] = values 8t .. 8t+7,
// rounded as DequantBlockPortable.
template <GgmlType kType>
inline void DequantBlockAvx2(const uint8_t* blk, __m256 w[4]) {
  if constexpr (kType == GgmlType::kF16) {
    for (int t = 0; t < 4; ++t) {
      w[t] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * t)));
    }
  } else if constexpr (kType == GgmlType::kQ8_0) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(LoadU16(blk)));
    for (int t = 0; t < 4; ++t) {
      const __m256i q = _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * t)));
      w[t] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
  } else {
    // 4-bit values: the bytes qs[0..7] hold values 0..7 (low nibbles) and
    // 16..23 (high), qs[8..15] values 8..15 and 24..31.
    constexpr int kQsOffset = kType == GgmlType::kQ4_0 ? 2 : kType == GgmlType::kQ4_1 ? 4 : 6;
    const __m256i a = LoadBytesU32(blk + kQsOffset);
    const __m256i b = LoadBytesU32(blk + kQsOffset + 8);
    const __m256i low = _mm256_set1_epi32(0x0F);
    __m256i q[4] = {_mm256_and_si256(a, low), _mm256_and_si256(b, low), _mm256_srli_epi32(a, 4),
                    _mm256_srli_epi32(b, 4)};
    if constexpr (kType == GgmlType::kQ4_1) {
      uint32_t dm_bits;
      std::memcpy(&dm_bits, blk, 4);
      const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm_bits)));
      const __m256 d = _mm256_broadcastss_ps(dm);
      const __m256 mn = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
      for (int t = 0; t < 4; ++t) w[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q[t]), mn);
    } else {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(LoadU16(blk)));
      __m256i zero_point = _mm256_set1_epi32(8);
      if constexpr (kType == GgmlType::kQ5_0) {
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        const __m256i bits = _mm256_set1_epi32(static_cast<int>(qh));
        const __m256i one = _mm256_set1_epi32(1);
        for (int t = 0; t < 4; ++t) {
          const __m256i shift = _mm256_setr_epi32(8 * t, 8 * t + 1, 8 * t + 2, 8 * t + 3,
                                                  8 * t + 4, 8 * t + 5, 8 * t + 6, 8 * t + 7);
          const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(bits, shift), one);
          q[t] = _mm256_or_si256(q[t], _mm256_slli_epi32(high, 4));
        }
        zero_point = _mm256_set1_epi32(16);
      }
      for (int t = 0; t < 4; ++t) {
        w[t] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q[t], zero_point)));
      }
    }
  }
}

// Decode path: outputs y[r, i0 + c] for r in [0, R), c in [0, C), each
// weight block dequantised once in registers and used for all R rows.
template <GgmlType kType, int R, int C>
void RegisterTileAvx2(const float* x, const uint8_t* w, size_t row_bytes, int i0, int n, int k,
                      float* y) {
  constexpr int kBytes = BlockBytes(kType);
  constexpr int kValues = BlockValues(kType);
  const int nb = k / kValues;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const uint8_t* rows[C];
  for (int c = 0; c < C; ++c) rows[c] = w + size_t(i0 + c) * row_bytes;
  // The FMAs of one 32-value chunk of weights (the weights of column c).
  auto fma_chunk = [&](int c, const __m256 wv[4], size_t x_offset) {
    for (int r = 0; r < R; ++r) {
      const float* xb = x + size_t(r) * k + x_offset;
      for (int t = 0; t < 4; ++t) {
        acc[r][c] = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(xb + 8 * t), acc[r][c]);
      }
    }
  };
  for (int b = 0; b < nb; ++b) {
    if constexpr (kValues == kChunk) {
      for (int c = 0; c < C; ++c) {
        __m256 wv[4];
        DequantBlockAvx2<kType>(rows[c] + size_t(b) * kBytes, wv);
        fma_chunk(c, wv, size_t(b) * kValues);
      }
    } else {
      KScales ks[C];
      for (int c = 0; c < C; ++c) UnpackKScalesAvx2<kType>(rows[c] + size_t(b) * kBytes, &ks[c]);
      ForEachSubBlock([&](auto sub) {
        for (int c = 0; c < C; ++c) {
          __m256 wv[4];
          DequantSubBlockAvx2<kType, sub.value, (R > 2)>(rows[c] + size_t(b) * kBytes, ks[c],
                                                         wv);
          fma_chunk(c, wv, size_t(b) * kValues + sub.value * kChunk);
        }
      });
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[size_t(r) * n + i0 + c] = ReduceLanesAvx2(acc[r][c]);
  }
}

// Register path for weight rows [i_begin, i_end) and R = m rows: 4 columns
// at a time for 1 or 2 rows, 2 for 3 or 4 (16 vector registers).
template <GgmlType kType, int R>
void RegisterGroupAvx2(const float* x, const uint8_t* w, size_t row_bytes, int i_begin,
                       int i_end, int n, int k, float* y) {
  int i = i_begin;
  if constexpr (R <= 2) {
    for (; i + 4 <= i_end; i += 4) RegisterTileAvx2<kType, R, 4>(x, w, row_bytes, i, n, k, y);
  }
  for (; i + 2 <= i_end; i += 2) RegisterTileAvx2<kType, R, 2>(x, w, row_bytes, i, n, k, y);
  for (; i < i_end; ++i) RegisterTileAvx2<kType, R, 1>(x, w, row_bytes, i, n, k, y);
}

template <GgmlType kType>
void RegisterGroupAvx2(const float* x, const uint8_t* w, size_t row_bytes, int m, int i_begin,
                       int i_end, int n, int k, float* y) {
  switch (m) {
    case 1: RegisterGroupAvx2<kType, 1>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    case 2: RegisterGroupAvx2<kType, 2>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    case 3: RegisterGroupAvx2<kType, 3>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    case 4: RegisterGroupAvx2<kType, 4>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    default: break;
  }
}

template <GgmlType kType>
void DequantRowAvx2(const uint8_t* row, int k, float* out) {
  constexpr int kBytes = BlockBytes(kType);
  constexpr int kValues = BlockValues(kType);
  for (int b = 0; b < k / kValues; ++b) {
    const uint8_t* blk = row + size_t(b) * kBytes;
    float* o = out + size_t(b) * kValues;
    if constexpr (kValues == kChunk) {
      __m256 wv[4];
      DequantBlockAvx2<kType>(blk, wv);
      for (int t = 0; t < 4; ++t) _mm256_storeu_ps(o + 8 * t, wv[t]);
    } else {
      KScales ks;
      UnpackKScalesAvx2<kType>(blk, &ks);
      ForEachSubBlock([&](auto sub) {
        __m256 wv[4];
        DequantSubBlockAvx2<kType, sub.value, false>(blk, ks, wv);
        for (int t = 0; t < 4; ++t) _mm256_storeu_ps(o + sub.value * kChunk + 8 * t, wv[t]);
      });
    }
  }
}

// Prefill path: outputs y[r0 + r, i0 + c] for r in [0, R), c in [0, C) from
// C dequantised weight rows `ws` (stride k).
template <int R, int C>
void ScratchTileAvx2(const float* x, const float* ws, int r0, int i0, int n, int k, float* y) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const float* xr = x + size_t(r0) * k;
  for (int u = 0; u < k; u += kLanes) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(ws + size_t(c) * k + u);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(xr + size_t(r) * k + u);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv[c], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[size_t(r0 + r) * n + i0 + c] = ReduceLanesAvx2(acc[r][c]);
  }
}

template <int R>
void ScratchRowsAvx2(const float* x, const float* ws, int rows, int r0, int i0, int n, int k,
                     float* y) {
  int c = 0;
  for (; c + 3 <= rows; c += 3) ScratchTileAvx2<R, 3>(x, ws + size_t(c) * k, r0, i0 + c, n, k, y);
  switch (rows - c) {
    case 2: ScratchTileAvx2<R, 2>(x, ws + size_t(c) * k, r0, i0 + c, n, k, y); break;
    case 1: ScratchTileAvx2<R, 1>(x, ws + size_t(c) * k, r0, i0 + c, n, k, y); break;
    default: break;
  }
}

// Prefill path for weight rows [i_begin, i_end): dequantise them into
// `scratch`, then sweep all m rows.
template <GgmlType kType>
void ScratchGroupAvx2(const float* x, const uint8_t* w, size_t row_bytes, int m, int i_begin,
                      int i_end, int n, int k, float* y, float* scratch) {
  const int rows = i_end - i_begin;
  for (int c = 0; c < rows; ++c) {
    DequantRowAvx2<kType>(w + size_t(i_begin + c) * row_bytes, k, scratch + size_t(c) * k);
  }
  int r0 = 0;
  for (; r0 + 4 <= m; r0 += 4) ScratchRowsAvx2<4>(x, scratch, rows, r0, i_begin, n, k, y);
  switch (m - r0) {
    case 3: ScratchRowsAvx2<3>(x, scratch, rows, r0, i_begin, n, k, y); break;
    case 2: ScratchRowsAvx2<2>(x, scratch, rows, r0, i_begin, n, k, y); break;
    case 1: ScratchRowsAvx2<1>(x, scratch, rows, r0, i_begin, n, k, y); break;
    default: break;
  }
}

template <GgmlType kType>
void GroupAvx2(const float* x, const uint8_t* w, size_t row_bytes, int m, int i_begin, int i_end,
               int n, int k, float* y, float* scratch) {
  if (m <= kRegisterPathMaxRows) {
    RegisterGroupAvx2<kType>(x, w, row_bytes, m, i_begin, i_end, n, k, y);
  } else {
    ScratchGroupAvx2<kType>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
  }
}

void GroupAvx2(GgmlType type, const float* x, const uint8_t* w, size_t row_bytes, int m,
               int i_begin, int i_end, int n, int k, float* y, float* scratch) {
  switch (type) {
    case GgmlType::kQ8_0:
      GroupAvx2<GgmlType::kQ8_0>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    case GgmlType::kQ4_0:
      GroupAvx2<GgmlType::kQ4_0>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    case GgmlType::kQ4_1:
      GroupAvx2<GgmlType::kQ4_1>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    case GgmlType::kQ5_0:
      GroupAvx2<GgmlType::kQ5_0>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    case GgmlType::kF16:
      GroupAvx2<GgmlType::kF16>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    case GgmlType::kQ4_K:
      GroupAvx2<GgmlType::kQ4_K>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    case GgmlType::kQ6_K:
      GroupAvx2<GgmlType::kQ6_K>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch);
      break;
    default: break;
  }
}

#endif  // HEADWAY_QMM_F32ACT_AVX2

void Run(bool simd, const float* x, const uint8_t* w_quant, GgmlType w_type, int m, int n, int k,
         float* y) {
  HW_CHECK(QuantMatmulSupported(w_type));
  HW_CHECK(m >= 0 && n >= 0 && k >= 0 && k % BlockValues(w_type) == 0);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + size_t(m) * n, 0.0f);
    return;
  }
#ifndef HEADWAY_QMM_F32ACT_AVX2
  simd = false;
#endif
  const int block_values = BlockValues(w_type);
  const size_t row_bytes = size_t(k / block_values) * BlockBytes(w_type);
  const bool threads = int64_t{n} * k >= kMinWeightsForThreads;
  // The group size only decides which thread computes an output, never how.
  const bool scratch_path = simd && m > kRegisterPathMaxRows;
  const int group = scratch_path ? ScratchRows(k) : simd ? kColGroup : 1;
  const int num_groups = (n + group - 1) / group;

#pragma omp parallel if (threads)
  {
    std::vector<float> scratch(size_t(simd ? (scratch_path ? group : 0) : 1) * k);
#pragma omp for schedule(static)
    for (int g = 0; g < num_groups; ++g) {
      const int i_begin = g * group, i_end = std::min(n, i_begin + group);
#ifdef HEADWAY_QMM_F32ACT_AVX2
      if (simd) {
        GroupAvx2(w_type, x, w_quant, row_bytes, m, i_begin, i_end, n, k, y, scratch.data());
        continue;
      }
#endif
      for (int i = i_begin; i < i_end; ++i) {
        const uint8_t* row = w_quant + size_t(i) * row_bytes;
        for (int b = 0; b < k / block_values; ++b) {
          DequantBlockPortable(w_type, row + size_t(b) * BlockBytes(w_type),
                               scratch.data() + size_t(b) * block_values);
        }
        RowPortable(x, scratch.data(), m, n, k, i, y);
      }
    }
  }
}

}  // namespace

bool QuantMatmulSupported(GgmlType type) { return quant::IsKernelBlockType(type); }

void QuantMatmulTransBF32Act(const float* x, const uint8_t* w_quant, GgmlType w_type, int m,
                             int n, int k, float* y) {
  Run(/*simd=*/true, x, w_quant, w_type, m, n, k, y);
}

namespace internal {

void QuantMatmulTransBF32ActPortable(const float* x, const uint8_t* w_quant, GgmlType w_type,
                                     int m, int n, int k, float* y) {
  Run(/*simd=*/false, x, w_quant, w_type, m, n, k, y);
}

bool QuantMatmulHasSimd() {
#ifdef HEADWAY_QMM_F32ACT_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace internal
}  // namespace headway::cpu
