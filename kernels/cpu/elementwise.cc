// Embedding, RMSNorm, RoPE, SwiGLU and residual add, CPU backend.
#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "kernels/cpu/exp_avx2.h"
#include "kernels/threads.h"

namespace headway::cpu {
namespace {

// Rows per chunk of the row-wise kernels: 32K values, below which a row loop
// runs on one thread (waking helpers costs more than such a loop).
int64_t MinRowsPerChunk(int dim) { return std::max(1, (1 << 15) / std::max(dim, 1)); }

void RmsNormRow(const float* row, const float* weight, int dim, float eps, float* o) {
  // Double sum as in llama.cpp's ggml_float, so long rows lose no precision.
  double sum_sq = 0.0;
#pragma omp simd reduction(+ : sum_sq)
  for (int d = 0; d < dim; ++d) sum_sq += double(row[d]) * row[d];
  const float inv = float(1.0 / std::sqrt(sum_sq / dim + eps));
#pragma omp simd
  for (int d = 0; d < dim; ++d) o[d] = row[d] * inv * weight[d];
}

}  // namespace

void Embedding(const float* table, const int32_t* ids, int n, int dim, float* out) {
  ParallelFor(n, MinRowsPerChunk(dim), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(out + size_t(i) * dim, table + size_t(ids[i]) * dim, sizeof(float) * dim);
    }
  });
}

void EmbeddingShard(const float* table, int row_begin, int row_end, const int32_t* ids, int n,
                    int dim, float* out) {
  ParallelFor(n, MinRowsPerChunk(dim), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = out + size_t(i) * dim;
      if (ids[i] >= row_begin && ids[i] < row_end) {
        std::memcpy(row, table + size_t(ids[i] - row_begin) * dim, sizeof(float) * dim);
      } else {
        std::memset(row, 0, sizeof(float) * dim);
      }
    }
  });
}

void RmsNorm(const float* x, const float* weight, int n_rows, int dim, float eps, float* out) {
  ParallelFor(n_rows, MinRowsPerChunk(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) RmsNormRow(x + size_t(r) * dim, weight, dim, eps,
                                                     out + size_t(r) * dim);
  });
}

void ComputeRopeAngles(const int32_t* positions, int n_tokens, int head_dim, float freq_base,
                       RopeAngles* out) {
  const int half = head_dim / 2;
  out->n_tokens = n_tokens;
  out->head_dim = head_dim;
  out->freq_base = freq_base;
  out->cos.resize(size_t(n_tokens) * half);
  out->sin.resize(size_t(n_tokens) * half);
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(double(freq_base), -2.0 * i / head_dim);
  // Two transcendentals per value: worth threads from fewer values than a
  // memory-bound loop.
  ParallelFor(n_tokens, std::max(1, 1024 / std::max(1, half)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* cos_t = out->cos.data() + size_t(t) * half;
      float* sin_t = out->sin.data() + size_t(t) * half;
      for (int i = 0; i < half; ++i) {
        const double theta = positions[t] * inv_freq[i];
        cos_t[i] = float(std::cos(theta));
        sin_t[i] = float(std::sin(theta));
      }
    }
  });
}

void Rope(float* x, const int32_t* positions, int n_tokens, int n_heads, int head_dim,
          float freq_base, RopeStyle style) {
  RopeAngles angles;
  ComputeRopeAngles(positions, n_tokens, head_dim, freq_base, &angles);
  Rope(x, angles, n_heads, style);
}

void Rope(float* x, const RopeAngles& angles, int n_heads, RopeStyle style) {
  const int head_dim = angles.head_dim;
  const int half = head_dim / 2;
  const int64_t row_values = int64_t(n_heads) * head_dim;
  ParallelFor(angles.n_tokens, MinRowsPerChunk(int(row_values)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos_t = angles.cos.data() + size_t(t) * half;
      const float* sin_t = angles.sin.data() + size_t(t) * half;
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (size_t(t) * n_heads + h) * head_dim;
        if (style == RopeStyle::kInterleaved) {
          for (int i = 0; i < half; ++i) {
            const float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
            v[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
          }
        } else {
#pragma omp simd
          for (int i = 0; i < half; ++i) {
            const float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cos_t[i] - x1 * sin_t[i];
            v[i + half] = x0 * sin_t[i] + x1 * cos_t[i];
          }
        }
      }
    }
  });
}

namespace {

// The gated activations take an exponential per element, so they split
// across threads from fewer elements than the memory-bound kernels: a
// decode step of 32 rows has 32 x 1536 of them.
constexpr int64_t kMinTranscendentalsForThreads = int64_t{1} << 13;

// out[i] = act(gate[i]) * up[i] for i < n, 8 lanes at a time; the last
// n % 8 values take the same lanes, masked, so a value's result never
// depends on n or on its index. act(g) = g / (1 + e^(z(g))): both gated
// activations are a sigmoid-weighted gate.
template <class Exponent>
void SigmoidGated(const float* gate, const float* up, int64_t n, float* out, Exponent z) {
  ParallelFor(n, kMinTranscendentalsForThreads / 2, [&](int64_t begin, int64_t end) {
    const __m256 one = _mm256_set1_ps(1.0f);
    auto gated = [&](__m256 g, __m256 u) {
      return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, avx2::Exp8(z(g)))), u);
    };
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      _mm256_storeu_ps(out + i, gated(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    }
    if (i < end) {
      alignas(32) int32_t lanes[8];
      for (int l = 0; l < 8; ++l) lanes[l] = i + l < end ? -1 : 0;
      const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
      _mm256_maskstore_ps(
          out + i, mask, gated(_mm256_maskload_ps(gate + i, mask), _mm256_maskload_ps(up + i, mask)));
    }
  });
}

}  // namespace

// Through libm's scalar expf and tanhf these were 4 % of SmolLM2 serving
// at 32 sequences and a sixth of a Gemma 3 step (perf: expf, expm1f, tanhf).
void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  // silu(g) = g / (1 + e^(-g)).
  SigmoidGated(gate, up, n, out, [](__m256 g) { return _mm256_sub_ps(_mm256_setzero_ps(), g); });
}

void GeluTanhGated(const float* gate, const float* up, int64_t n, float* out) {
  // 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3).
  SigmoidGated(gate, up, n, out, [](__m256 g) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    return _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608028654f),
                         _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  });
}

void ScaleInPlace(float* out, float scale, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] *= scale;
}

void AddInPlace(float* out, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

}  // namespace headway::cpu
