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
#include "kernels/quant_matmul.h"

#include "kernels/cpu/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HEADWAY_QMM_F32ACT_AVX2 1
#endif

#include "common/status.h"

namespace headway::cpu {
namespace {

using internal::BlockBytes;
using internal::HalfToFloat;
using internal::LoadU16;

constexpr int kBlock = 32;     // values per weight block
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

// One block's 32 weights, rounded as the header states.
void DequantBlockPortable(GgmlType type, const uint8_t* blk, float* w) {
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

// The 32 weights of `blk` as w[t] = values 8t .. 8t+7, rounded as
// DequantBlockPortable.
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
  const int nb = k / kBlock;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const uint8_t* rows[C];
  for (int c = 0; c < C; ++c) rows[c] = w + size_t(i0 + c) * row_bytes;
  for (int b = 0; b < nb; ++b) {
    for (int c = 0; c < C; ++c) {
      __m256 wv[4];
      DequantBlockAvx2<kType>(rows[c] + size_t(b) * kBytes, wv);
      for (int r = 0; r < R; ++r) {
        const float* xb = x + size_t(r) * k + size_t(b) * kBlock;
        for (int t = 0; t < 4; ++t) {
          acc[r][c] = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(xb + 8 * t), acc[r][c]);
        }
      }
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
  for (int b = 0; b < k / kBlock; ++b) {
    __m256 wv[4];
    DequantBlockAvx2<kType>(row + size_t(b) * kBytes, wv);
    for (int t = 0; t < 4; ++t) _mm256_storeu_ps(out + b * kBlock + 8 * t, wv[t]);
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
    default: break;
  }
}

#endif  // HEADWAY_QMM_F32ACT_AVX2

void Run(bool simd, const float* x, const uint8_t* w_quant, GgmlType w_type, int m, int n, int k,
         float* y) {
  HW_CHECK(QuantMatmulSupported(w_type));
  HW_CHECK(m >= 0 && n >= 0 && k >= 0 && k % kBlock == 0);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + size_t(m) * n, 0.0f);
    return;
  }
#ifndef HEADWAY_QMM_F32ACT_AVX2
  simd = false;
#endif
  const size_t row_bytes = size_t(k / kBlock) * BlockBytes(w_type);
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
        for (int b = 0; b < k / kBlock; ++b) {
          DequantBlockPortable(w_type, row + size_t(b) * BlockBytes(w_type),
                               scratch.data() + size_t(b) * kBlock);
        }
        RowPortable(x, scratch.data(), m, n, k, i, y);
      }
    }
  }
}

}  // namespace

void QuantMatmulTransBF32Act(const float* x, const uint8_t* w_quant, GgmlType w_type, int m,
                             int n, int k, float* y) {
  Run(/*simd=*/true, x, w_quant, w_type, m, n, k, y);
}

namespace internal {

void QuantMatmulTransBF32ActPortable(const float* x, const uint8_t* w_quant, GgmlType w_type,
                                     int m, int n, int k, float* y) {
  Run(/*simd=*/false, x, w_quant, w_type, m, n, k, y);
}

}  // namespace internal
}  // namespace headway::cpu
