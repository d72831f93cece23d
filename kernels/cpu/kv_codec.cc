#include "kernels/cpu/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <immintrin.h>

namespace headway::cpu {
namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline uint16_t ToHalf(float f) { return uint16_t(_cvtss_sh(f, kRound)); }
inline float FromHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// max |x[i]| over 32 values.
inline float AbsMax32(const float* x) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) m = _mm256_max_ps(m, _mm256_and_ps(abs_mask, _mm256_loadu_ps(x + 8 * c)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

void EncodeQ8_0(const float* x, int head_dim, uint8_t* row) {
  for (int g = 0; g < head_dim / 32; ++g, x += 32, row += 34) {
    const float d = AbsMax32(x) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = ToHalf(d);
    std::memcpy(row, &dh, 2);
    const __m256 id8 = _mm256_set1_ps(id);
    __m256i q[4];
    for (int c = 0; c < 4; ++c) {
      q[c] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * c), id8), kRound));
    }
    // Packs interleave 128-bit lanes; the permute puts values back in order.
    const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i ordered = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 2), ordered);
  }
}

void EncodeQ4_0(const float* x, int head_dim, uint8_t* row) {
  for (int g = 0; g < head_dim / 32; ++g, x += 32, row += 18) {
    float amax = 0.0f, m = 0.0f;  // the first value of the largest magnitude
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = ToHalf(d);
    std::memcpy(row, &dh, 2);
    for (int i = 0; i < 16; ++i) {
      // One rounding, as the format says (the compiler would fuse x * id +
      // 8.5 here but not in an unoptimised build: say it).
      const int lo = std::min(15, int(std::floor(std::fma(x[i], id, 8.5f))));
      const int hi = std::min(15, int(std::floor(std::fma(x[i + 16], id, 8.5f))));
      row[2 + i] = uint8_t(lo | (hi << 4));
    }
  }
}

// out[0..8) = d * (8 signed bytes at p).
inline void Scale8(__m128i bytes, __m256 d, float* out) {
  _mm256_storeu_ps(out, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))));
}

void DecodeQ8_0(const uint8_t* row, int head_dim, float* out) {
  for (int g = 0; g < head_dim / 32; ++g, row += 34, out += 32) {
    const __m256 d = _mm256_set1_ps(FromHalf(row));
    for (int c = 0; c < 4; ++c) {
      Scale8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 2 + 8 * c)), d, out + 8 * c);
    }
  }
}

void DecodeQ4_0(const uint8_t* row, int head_dim, float* out) {
  const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int g = 0; g < head_dim / 32; ++g, row += 18, out += 32) {
    const __m256 d = _mm256_set1_ps(FromHalf(row));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, low4), eight);                     // values 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), low4), eight);  // 16..31
    Scale8(lo, d, out);
    Scale8(_mm_srli_si128(lo, 8), d, out + 8);
    Scale8(hi, d, out + 16);
    Scale8(_mm_srli_si128(hi, 8), d, out + 24);
  }
}

}  // namespace

void Hadamard32Groups(float* x, int64_t n) {
  // Stages in the definition's order (step 1, 2, 4 inside each register of 8
  // values, 8 and 16 across them); every output of a stage is one sum or
  // difference of the same two inputs, so the bits are the scalar ones.
  const __m256 scale = _mm256_set1_ps(float(1.0 / std::sqrt(32.0)));
  auto within = [](__m256 v, __m256 partner, int blend) {
    // Lanes whose bit is clear take v + partner; the others partner - v.
    const __m256 sum = _mm256_add_ps(v, partner), diff = _mm256_sub_ps(partner, v);
    switch (blend) {
      case 0xAA: return _mm256_blend_ps(sum, diff, 0xAA);
      case 0xCC: return _mm256_blend_ps(sum, diff, 0xCC);
      default: return _mm256_blend_ps(sum, diff, 0xF0);
    }
  };
  for (int64_t g = 0; g < n; g += 32) {
    __m256 v[4];
    for (int c = 0; c < 4; ++c) v[c] = _mm256_loadu_ps(x + g + 8 * c);
    for (__m256& r : v) {
      r = within(r, _mm256_permute_ps(r, 0xB1), 0xAA);            // step 1
      r = within(r, _mm256_permute_ps(r, 0x4E), 0xCC);            // step 2
      r = within(r, _mm256_permute2f128_ps(r, r, 0x01), 0xF0);    // step 4
    }
    for (int step = 1; step <= 2; step *= 2) {  // 8 and 16 values apart
      for (int c = 0; c < 4; ++c) {
        if (c & step) continue;
        const __m256 a = v[c], b = v[c + step];
        v[c] = _mm256_add_ps(a, b);
        v[c + step] = _mm256_sub_ps(a, b);
      }
    }
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(x + g + 8 * c, _mm256_mul_ps(v[c], scale));
  }
}

void EncodeKvRow(const float* x, int head_dim, KvCacheDtype dtype, uint8_t* row) {
  switch (dtype) {
    case KvCacheDtype::kFloat32:
      std::memcpy(row, x, sizeof(float) * size_t(head_dim));
      return;
    case KvCacheDtype::kFloat16:
      for (int i = 0; i < head_dim; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), kRound));
      }
      return;
    case KvCacheDtype::kQ8_0: EncodeQ8_0(x, head_dim, row); return;
    case KvCacheDtype::kQ4_0: EncodeQ4_0(x, head_dim, row); return;
    case KvCacheDtype::kQ4_0Hadamard:
      for (int g = 0; g < head_dim / 32; ++g) {
        float group[32];
        std::memcpy(group, x + 32 * g, sizeof group);
        Hadamard32Groups(group, 32);
        EncodeQ4_0(group, 32, row + 18 * g);
      }
      return;
  }
}

void DecodeKvRows(const uint8_t* rows, int n, int head_dim, KvCacheDtype dtype, float* out) {
  const size_t row_bytes = KvCacheLayout{1, head_dim, dtype}.RowBytes();
  for (int r = 0; r < n; ++r, rows += row_bytes, out += head_dim) {
    switch (dtype) {
      case KvCacheDtype::kFloat32:
        std::memcpy(out, rows, row_bytes);
        break;
      case KvCacheDtype::kFloat16:
        for (int i = 0; i < head_dim; i += 8) {
          _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                        reinterpret_cast<const __m128i*>(rows + 2 * i))));
        }
        break;
      case KvCacheDtype::kQ8_0: DecodeQ8_0(rows, head_dim, out); break;
      case KvCacheDtype::kQ4_0:
      case KvCacheDtype::kQ4_0Hadamard: DecodeQ4_0(rows, head_dim, out); break;
    }
  }
}

}  // namespace headway::cpu
