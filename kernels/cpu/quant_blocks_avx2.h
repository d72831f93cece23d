// AVX2 decoders of the ggml block types (kernels/quant_matmul.h draws the
// layouts): each gives a block's weights as f32 vectors of 8 values, rounded
// as the portable decoder in quant_matmul_f32act.cc, so every path of the
// quantised matmul multiplies the same weights. Internal to kernels/cpu.
// Everything here is inline and compiled for the x86-64-v3 baseline, so a
// file that includes it may run anywhere the kernels run.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HEADWAY_QUANT_AVX2 1

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/quant_blocks.h"

namespace headway::cpu::avx2 {

using quant::BlockBytes;
using quant::BlockValues;
using quant::kQ4KQs;
using quant::kQ4KScales;
using quant::kQ6KD;
using quant::kQ6KQh;
using quant::kQ6KScales;
using quant::LoadU16;

constexpr int kChunk = 32;  // values dequantised together (a K super-block has 8)

// The 8 lanes of an output accumulator summed in the order
// kernels/quant_matmul.h fixes: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
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

// The k weights of one row in f32, rounded as DequantBlockPortable. Values
// 8j .. 8j + 7 go to out[j * chunk_stride ..]: chunk_stride 8 writes the row
// as it is; 16 interleaves it with another row, 8 values of each in turn
// (the paired layout of quant_paired_sweep.inc).
template <GgmlType kType>
void DequantRowAvx2(const uint8_t* row, int k, float* out, int chunk_stride = 8) {
  constexpr int kBytes = BlockBytes(kType);
  constexpr int kValues = BlockValues(kType);
  for (int b = 0; b < k / kValues; ++b) {
    const uint8_t* blk = row + size_t(b) * kBytes;
    float* o = out + size_t(b) * (kValues / 8) * chunk_stride;
    if constexpr (kValues == kChunk) {
      __m256 wv[4];
      DequantBlockAvx2<kType>(blk, wv);
      for (int t = 0; t < 4; ++t) _mm256_storeu_ps(o + t * chunk_stride, wv[t]);
    } else {
      KScales ks;
      UnpackKScalesAvx2<kType>(blk, &ks);
      ForEachSubBlock([&](auto sub) {
        __m256 wv[4];
        DequantSubBlockAvx2<kType, sub.value, false>(blk, ks, wv);
        for (int t = 0; t < 4; ++t) {
          _mm256_storeu_ps(o + (sub.value * 4 + t) * chunk_stride, wv[t]);
        }
      });
    }
  }
}

}  // namespace headway::cpu::avx2

#endif  // AVX2, FMA and F16C
