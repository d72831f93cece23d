// Embedding, RMSNorm, RoPE, gated activations and small vector ops on a CUDA
// device. Each kernel mirrors its CPU twin in kernels/cpu/elementwise.cc,
// including where that one computes in double (RMSNorm's final scale, RoPE's
// angles), so the backends agree to f32 rounding.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/elementwise.h"

namespace headway::cuda {
namespace {

constexpr int kThreads = 256;  // threads per CTA of every kernel here
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && kThreads <= 1024);

// Grid of a grid-stride loop over n values: enough CTAs to fill the device,
// never more than the work needs.
unsigned FlatGrid(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::min<int64_t>(blocks, 65535));
}

__device__ __forceinline__ float Bf16Bits(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }


// cpu::RmsNorm's scale, 1 / sqrt(mean(x^2) + eps), computed in double as there.
__device__ __forceinline__ float InverseRms(float sum_sq, int dim, float eps) {
  return float(1.0 / sqrt(double(sum_sq) / dim + eps));
}

__device__ __forceinline__ float TableValue(uint16_t bf16) { return Bf16Bits(bf16); }
__device__ __forceinline__ float TableValue(float f32) { return f32; }

// T: uint16_t (bf16 bits) or float.
template <typename T>
__global__ void EmbeddingShardKernel(const T* table, int row_begin, int row_end,
                                     const int32_t* ids, int dim, float scale, float* out) {
  const int i = blockIdx.x;
  const int32_t id = ids[i];
  float* row = out + size_t(i) * dim;
  if (id >= row_begin && id < row_end) {
    const T* src = table + size_t(id - row_begin) * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) row[d] = TableValue(src[d]) * scale;
  } else {
    for (int d = threadIdx.x; d < dim; d += blockDim.x) row[d] = 0.0f;
  }
}

// x and out may alias: every read of the row precedes the reduction's
// barrier, every write follows it, and a thread writes only what it read.
__global__ void RmsNormKernel(const float* x, const float* weight, int dim, float eps, float* out) {
  __shared__ float scratch[kWarps];
  const float* row = x + size_t(blockIdx.x) * dim;
  float* o = out + size_t(blockIdx.x) * dim;
  float sum_sq = 0.0f;
  for (int d = threadIdx.x; d < dim; d += kThreads) sum_sq += row[d] * row[d];
  const float inv = InverseRms(BlockSum<kWarps>(sum_sq, scratch), dim, eps);
  for (int d = threadIdx.x; d < dim; d += kThreads) o[d] = row[d] * inv * weight[d];
}

__global__ void AddRmsNormKernel(float* out, const float* x, const float* weight, int dim,
                                 float eps, float* normed) {
  __shared__ float scratch[kWarps];
  float* o = out + size_t(blockIdx.x) * dim;
  const float* xr = x + size_t(blockIdx.x) * dim;
  float* nr = normed + size_t(blockIdx.x) * dim;
  float sum_sq = 0.0f;
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    const float v = o[d] + xr[d];
    o[d] = v;
    sum_sq += v * v;
  }
  const float inv = InverseRms(BlockSum<kWarps>(sum_sq, scratch), dim, eps);
  // Each thread re-reads only the values it wrote itself.
  for (int d = threadIdx.x; d < dim; d += kThreads) nr[d] = o[d] * inv * weight[d];
}

// One CTA per token. The angles follow cpu::Rope exactly: inverse
// frequencies freq_base^(-2i/head_dim) and angles in double, cos and sin
// rounded to f32, then f32 rotations.
__global__ void RopeKernel(float* x, const int32_t* positions, int n_heads, int head_dim,
                           float freq_base, bool neox) {
  extern __shared__ float trig[];  // cos [half] | sin [half]
  const int half = head_dim / 2;
  float* cos_t = trig;
  float* sin_t = trig + half;
  const int t = blockIdx.x;
  const int32_t pos = positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double inv_freq = pow(double(freq_base), -2.0 * i / head_dim);
    const double theta = pos * inv_freq;
    cos_t[i] = float(cos(theta));
    sin_t[i] = float(sin(theta));
  }
  __syncthreads();
  float* tok = x + size_t(t) * n_heads * head_dim;
  const int pairs = n_heads * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int h = p / half, i = p % half;
    float* v = tok + size_t(h) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * cos_t[i] - x1 * sin_t[i];
    v[b] = x0 * sin_t[i] + x1 * cos_t[i];
  }
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void GeluTanhGatedKernel(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

__global__ void AddInPlaceKernel(float* out, const float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] += x[i];
  }
}

__global__ void GatherRowsKernel(const float* in, const int32_t* rows, int dim, float* out) {
  const float* src = in + size_t(rows[blockIdx.x]) * dim;
  float* dst = out + size_t(blockIdx.x) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
}

// Bit for bit headway::FloatToBf16 (kernels/cuda/bf16.h), NaN included,
// rather than __float2bfloat16, whose NaN encoding is not specified there.
__global__ void F32ToBf16Kernel(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u = __float_as_uint(in[i]);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      out[i] = uint16_t((u >> 16) | 0x0040u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      out[i] = uint16_t(u >> 16);
    }
  }
}

}  // namespace

void EmbeddingShard(const bf16_bits* table, int row_begin, int row_end, const int32_t* ids, int n,
                    int dim, float scale, float* out, Stream stream) {
  if (n <= 0 || dim <= 0) return;
  EmbeddingShardKernel<<<n, kThreads, 0, stream>>>(table, row_begin, row_end, ids, dim, scale, out);
}

void EmbeddingShard(const float* table, int row_begin, int row_end, const int32_t* ids, int n,
                    int dim, float scale, float* out, Stream stream) {
  if (n <= 0 || dim <= 0) return;
  EmbeddingShardKernel<<<n, kThreads, 0, stream>>>(table, row_begin, row_end, ids, dim, scale, out);
}

void RmsNorm(const float* x, const float* weight, int n_rows, int dim, float eps, float* out,
             Stream stream) {
  if (n_rows <= 0 || dim <= 0) return;
  RmsNormKernel<<<n_rows, kThreads, 0, stream>>>(x, weight, dim, eps, out);
}

void AddRmsNorm(float* out, const float* x, const float* weight, int n_rows, int dim, float eps,
                float* normed, Stream stream) {
  if (n_rows <= 0 || dim <= 0) return;
  AddRmsNormKernel<<<n_rows, kThreads, 0, stream>>>(out, x, weight, dim, eps, normed);
}

void Rope(float* x, const int32_t* positions, int n_tokens, int n_heads, int head_dim,
          float freq_base, cpu::RopeStyle style, Stream stream) {
  if (n_tokens <= 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) return;
  const size_t shared_bytes = sizeof(float) * size_t(head_dim);  // cos and sin, head_dim / 2 each
  RopeKernel<<<n_tokens, kThreads, shared_bytes, stream>>>(
      x, positions, n_heads, head_dim, freq_base, style == cpu::RopeStyle::kNeox);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out, Stream stream) {
  if (n <= 0) return;
  SwiGluKernel<<<FlatGrid(n), kThreads, 0, stream>>>(gate, up, n, out);
}

void GeluTanhGated(const float* gate, const float* up, int64_t n, float* out, Stream stream) {
  if (n <= 0) return;
  GeluTanhGatedKernel<<<FlatGrid(n), kThreads, 0, stream>>>(gate, up, n, out);
}

void AddInPlace(float* out, const float* x, int64_t n, Stream stream) {
  if (n <= 0) return;
  AddInPlaceKernel<<<FlatGrid(n), kThreads, 0, stream>>>(out, x, n);
}

void GatherRows(const float* in, const int32_t* rows, int n, int dim, float* out, Stream stream) {
  if (n <= 0 || dim <= 0) return;
  GatherRowsKernel<<<n, kThreads, 0, stream>>>(in, rows, dim, out);
}

void F32ToBf16(const float* in, int64_t n, bf16_bits* out, Stream stream) {
  if (n <= 0) return;
  F32ToBf16Kernel<<<FlatGrid(n), kThreads, 0, stream>>>(in, n, out);
}

}  // namespace headway::cuda
