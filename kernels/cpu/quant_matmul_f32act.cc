// QuantMatmulTransBF32Act: quantised weights against f32 activations; the
// contract and the summation order are in kernels/quant_matmul.h.
//
// Two AVX2 strategies, chosen by m, that give the same bits because each
// output's FMA sequence is the same in both:
//   - m <= kRegisterPathMaxRows (decode): each weight block is dequantised in
//     registers and FMA'd straight into the (up to 8) activation rows; weight
//     bytes are read once and nothing is written but y.
//   - larger m (prefill): a group of weight rows is dequantised once into an
//     f32 scratch that stays in L2, then swept by 4-row x 3-column tiles of
//     outputs (12 accumulators keep both FMA pipes busy), so the
//     dequantisation cost is shared by all m rows.
// On CPUs with AVX-512 the larger-m strategy keeps two weight rows per zmm
// register (quant_matmul_paired.h) with each output's FMA sequence unchanged.
// The portable path dequantises a weight row into a scratch row and runs the
// same lanes with std::fma, so it agrees bit for bit with the AVX2 path.
// Q4_K and Q6_K super-blocks have their sub-block scales unpacked once per
// block and weight row (KScales), then are dequantised 32 values (one
// sub-block) at a time, in value order, so their FMA order is the header's.
#include "kernels/quant_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/aligned_vector.h"
#include "common/status.h"
#include "kernels/cpu/quant_blocks_avx2.h"
#include "kernels/cpu/quant_matmul_paired.h"
#include "kernels/quant_blocks.h"
#include "kernels/threads.h"

namespace headway::cpu {
namespace {

using Path = internal::QuantMatmulPath;

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
// Up to 8 rows the register path beats dequantising into a scratch, even
// though past 4 rows its accumulators no longer all fit 16 registers: a
// SmolLM2 decode step at 5 sequences took 13.7-15.6 ms against 19.9-21.3
// on the paired scratch path, at 8 sequences 19.9-22.6 against 25.2-25.9
// (three alternated runs); at 12 the two tie, at 16 the scratch path is
// ahead (38.5 against 51.7 ms; headway-worker-step-bench --threads 2
// --prompt-tokens 256 --decode-tokens 64 --batch N, Zen 4). Compiling
// these tiles for AVX-512VL's 32 registers, so that nothing spills, did
// not beat the spilling AVX2 code there (14.8 and 20.5-20.8 ms).
constexpr int kRegisterPathMaxRows = 8;
// How far ahead the register path prefetches weight rows. Its tiles read C
// rows side by side, a pattern the hardware prefetchers follow poorly: on a
// Zen 3 VM prefetching 8 rows ahead made the Q8_0 LM head (49152 x 576, 30
// MB, from DRAM) 3x faster at one activation row and the Q4_1 matrices 1.2x.
constexpr int kPrefetchRows = 8;
// f32 scratch per thread for the prefill path: 192 KiB (at least 3 rows),
// inside L2, and enough weight rows per group that x is streamed few times.
constexpr int kScratchFloats = 48 * 1024;
constexpr int kMaxScratchRows = 30;
constexpr int kMaxPairedScratchRows = 32;
// Below this many weights per call, starting threads costs more than it saves.
constexpr int64_t kMinWeightsForThreads = int64_t{1} << 15;

// Weight rows dequantised per group in the prefill path: as many as fit the
// scratch, a multiple of 3 (the tiles take 3 columns), at least 3.
int ScratchRows(int k) {
  return std::clamp(kScratchFloats / k / 3 * 3, 3, kMaxScratchRows);
}

// The same for the paired path: a multiple of 8 (its tiles take 4 pairs).
int PairedScratchRows(int k) {
  return std::clamp(kScratchFloats / k / 8 * 8, 8, kMaxPairedScratchRows);
}

// The weight rows of the group a thread takes after this one, which the
// scratch paths ask to be brought into L2 while they dequantise and sweep
// this group. The sweep reads only the scratch and x, so the hardware
// prefetchers would otherwise start cold at every group. It matters where
// weights come from DRAM at every step and m is small: SmolLM2's Q8_0 LM
// head with cold weights at m = 16 went from 7.8-8.2 ms to 7.0-7.5 ms
// (headway-quant-matmul-bench --threads 2 --m 16 --shape lm_head
// --lm-head-max-m 16 --cold-max-m 16, three alternated runs on Zen 4).
#ifdef HEADWAY_QUANT_AVX2
struct NextGroup {
  const uint8_t* rows = nullptr;  // first byte of its first row; nullptr: none
  int num_rows = 0;
  size_t row_bytes = 0;

  // Prefetches row c of the next group, if it has one.
  void PrefetchRow(int c) const {
    if (rows == nullptr || c >= num_rows) return;
    const uint8_t* p = rows + size_t(c) * row_bytes;
    for (size_t line = 0; line < row_bytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p + line), _MM_HINT_T1);
    }
  }
};
#endif  // HEADWAY_QUANT_AVX2

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

#ifdef HEADWAY_QUANT_AVX2

using avx2::DequantBlockAvx2;
using avx2::DequantRowAvx2;
using avx2::DequantSubBlockAvx2;
using avx2::ForEachSubBlock;
using avx2::KScales;
using avx2::ReduceLanesAvx2;
using avx2::UnpackKScalesAvx2;

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
  // The C rows kPrefetchRows further on, C * kBytes bytes of them per block,
  // so that they are in cache when their tile runs (none past row n).
  const uint8_t* ahead =
      i0 + kPrefetchRows + C <= n ? w + size_t(i0 + kPrefetchRows) * row_bytes : nullptr;
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
    if (ahead != nullptr) {
      const uint8_t* p = ahead + size_t(b) * C * kBytes;
      for (int line = 0; line < C * kBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(p + line), _MM_HINT_T0);
      }
    }
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
// at a time for 1 or 2 rows, 2 for 3 to 8 (16 vector registers hold the
// accumulators up to 4 rows; past that some spill to L1, still faster than
// 1 column at a time, whose dequantisation is shared by fewer FMAs).
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
    case 5: RegisterGroupAvx2<kType, 5>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    case 6: RegisterGroupAvx2<kType, 6>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    case 7: RegisterGroupAvx2<kType, 7>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    case 8: RegisterGroupAvx2<kType, 8>(x, w, row_bytes, i_begin, i_end, n, k, y); break;
    default: break;
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
    // The empty asm statements pin each loaded vector to a register. Without
    // them GCC folds loads into the FMAs that use them and shuffles the rest
    // between registers: more load and move uops per FMA, the same bits.
    for (int c = 0; c < C; ++c) {
      wv[c] = _mm256_loadu_ps(ws + size_t(c) * k + u);
      asm("" : "+x"(wv[c]));
    }
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(xr + size_t(r) * k + u);
      asm("" : "+x"(xv));
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
                      int i_end, int n, int k, float* y, float* scratch, const NextGroup& next) {
  const int rows = i_end - i_begin;
  for (int c = 0; c < rows; ++c) {
    next.PrefetchRow(c);
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
               int n, int k, float* y, float* scratch, const NextGroup& next) {
  if (m <= kRegisterPathMaxRows) {
    RegisterGroupAvx2<kType>(x, w, row_bytes, m, i_begin, i_end, n, k, y);
  } else {
    ScratchGroupAvx2<kType>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch, next);
  }
}

// f(std::integral_constant<GgmlType, type>{}) for a kernel block type.
template <class F>
void WithBlockType(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::kQ8_0: f(std::integral_constant<GgmlType, GgmlType::kQ8_0>{}); break;
    case GgmlType::kQ4_0: f(std::integral_constant<GgmlType, GgmlType::kQ4_0>{}); break;
    case GgmlType::kQ4_1: f(std::integral_constant<GgmlType, GgmlType::kQ4_1>{}); break;
    case GgmlType::kQ5_0: f(std::integral_constant<GgmlType, GgmlType::kQ5_0>{}); break;
    case GgmlType::kF16: f(std::integral_constant<GgmlType, GgmlType::kF16>{}); break;
    case GgmlType::kQ4_K: f(std::integral_constant<GgmlType, GgmlType::kQ4_K>{}); break;
    case GgmlType::kQ6_K: f(std::integral_constant<GgmlType, GgmlType::kQ6_K>{}); break;
    default: break;
  }
}

void GroupAvx2(GgmlType type, const float* x, const uint8_t* w, size_t row_bytes, int m,
               int i_begin, int i_end, int n, int k, float* y, float* scratch,
               const NextGroup& next) {
  WithBlockType(type, [&](auto t) {
    GroupAvx2<decltype(t)::value>(x, w, row_bytes, m, i_begin, i_end, n, k, y, scratch, next);
  });
}

// Prefill path with two weight rows per 16-lane vector (quant_matmul_paired.h):
// weight rows [i_begin, i_end) dequantised into `scratch` in the paired
// layout, then swept on AVX-512 or, for tests, on AVX2 registers.
void PairedGroup(Path path, GgmlType type, const float* x, const uint8_t* w, size_t row_bytes,
                 int m, int i_begin, int i_end, int n, int k, float* y, float* scratch,
                 const NextGroup& next) {
  const int rows = i_end - i_begin;
  WithBlockType(type, [&](auto t) {
    for (int c = 0; c < rows; ++c) {
      next.PrefetchRow(c);
      DequantRowAvx2<decltype(t)::value>(w + size_t(i_begin + c) * row_bytes, k,
                                         scratch + size_t(c / 2) * 2 * k + 8 * (c % 2),
                                         /*chunk_stride=*/16);
    }
  });
  if (rows % 2 != 0) {  // the last pair's second row: zeros, its outputs dropped
    float* pad = scratch + size_t(rows / 2) * 2 * k + 8;
    for (int u = 0; u < k; u += 8) std::fill(pad + 2 * u, pad + 2 * u + 8, 0.0f);
  }
  if (path == Path::kAvx512) {
    paired::SweepAvx512(x, scratch, rows, m, i_begin, n, k, y);
  } else {
    paired::SweepAvx2(x, scratch, rows, m, i_begin, n, k, y);
  }
}

#endif  // HEADWAY_QUANT_AVX2

void Run(Path path, const float* x, const uint8_t* w_quant, GgmlType w_type, int m, int n, int k,
         float* y) {
  HW_CHECK(QuantMatmulSupported(w_type));
  HW_CHECK(m >= 0 && n >= 0 && k >= 0 && k % BlockValues(w_type) == 0);
  HW_CHECK(internal::QuantMatmulPathSupported(path));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + size_t(m) * n, 0.0f);
    return;
  }
  const bool simd = path != Path::kPortable;
  const int block_values = BlockValues(w_type);
  const size_t row_bytes = size_t(k / block_values) * BlockBytes(w_type);
  const bool threads = int64_t{n} * k >= kMinWeightsForThreads;
  // The group size only decides which thread computes an output, never how.
  const bool scratch_path = simd && m > kRegisterPathMaxRows;
  const bool paired = scratch_path && (path == Path::kAvx512 || path == Path::kAvx2Paired);
  const int group = paired         ? PairedScratchRows(k)
                    : scratch_path ? ScratchRows(k)
                    : simd         ? kColGroup
                                   : 1;
  const int num_groups = (n + group - 1) / group;
  // The sweeps read x in 32-byte pieces at offsets that are multiples of 32
  // bytes (k % 8 == 0); a caller's buffer that is not 32-byte aligned makes
  // half of those loads straddle two cache lines, so it is copied once here
  // (m * k floats, against m * n * k FMAs).
  if (scratch_path && reinterpret_cast<uintptr_t>(x) % 32 != 0) {
    thread_local AlignedVector<float> x_aligned;
    x_aligned.assign(x, x + size_t(m) * k);
    x = x_aligned.data();
  }
  const size_t scratch_floats = paired         ? size_t(group + 1) / 2 * 2 * k
                                : scratch_path ? size_t(group) * k
                                : simd         ? 0
                                               : size_t(k);

  // A group's rows are dequantised into `scratch` and swept by one thread;
  // the buffer stays with the thread from call to call.
  ParallelFor(num_groups, threads ? 1 : num_groups, [&](int64_t g_begin, int64_t g_end) {
    thread_local AlignedVector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int i_begin = int(g) * group, i_end = std::min(n, i_begin + group);
#ifdef HEADWAY_QUANT_AVX2
      NextGroup next;
      if (scratch_path && g + 1 < g_end) {
        next = {w_quant + size_t(i_end) * row_bytes, std::min(n, i_end + group) - i_end,
                row_bytes};
      }
      if (paired) {
        PairedGroup(path, w_type, x, w_quant, row_bytes, m, i_begin, i_end, n, k, y,
                    scratch.data(), next);
        continue;
      }
      if (simd) {
        GroupAvx2(w_type, x, w_quant, row_bytes, m, i_begin, i_end, n, k, y, scratch.data(),
                  next);
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
  });
}

Path DetectBestPath() {
#ifdef HEADWAY_QUANT_AVX2
  return paired::CpuHasAvx512() ? Path::kAvx512 : Path::kAvx2;
#else
  return Path::kPortable;
#endif
}

}  // namespace

bool QuantMatmulSupported(GgmlType type) { return quant::IsKernelBlockType(type); }

void QuantMatmulTransBF32Act(const float* x, const uint8_t* w_quant, GgmlType w_type, int m,
                             int n, int k, float* y) {
  Run(internal::QuantMatmulBestPath(), x, w_quant, w_type, m, n, k, y);
}

namespace internal {

void QuantMatmulTransBF32ActPortable(const float* x, const uint8_t* w_quant, GgmlType w_type,
                                     int m, int n, int k, float* y) {
  Run(Path::kPortable, x, w_quant, w_type, m, n, k, y);
}

void QuantMatmulTransBF32ActOn(QuantMatmulPath path, const float* x, const uint8_t* w_quant,
                               GgmlType w_type, int m, int n, int k, float* y) {
  Run(path, x, w_quant, w_type, m, n, k, y);
}

QuantMatmulPath QuantMatmulBestPath() {
  static const QuantMatmulPath best = DetectBestPath();
  return best;
}

bool QuantMatmulPathSupported(QuantMatmulPath path) {
  switch (path) {
    case Path::kPortable: return true;
    case Path::kAvx2:
    case Path::kAvx2Paired: return QuantMatmulBestPath() != Path::kPortable;
    case Path::kAvx512: return QuantMatmulBestPath() == Path::kAvx512;
  }
  return false;
}

const char* QuantMatmulPathName(QuantMatmulPath path) {
  switch (path) {
    case Path::kPortable: return "portable";
    case Path::kAvx2: return "avx2";
    case Path::kAvx2Paired: return "avx2-paired";
    case Path::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace internal
}  // namespace headway::cpu
