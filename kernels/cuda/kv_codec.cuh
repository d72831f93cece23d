// The KV cache dtypes' rows (common/kv_layout.h) on a CUDA device: the
// device twins of kernels/cpu/kv_codec.h. Encoding rounds exactly as
// reference::QuantizeKvRow does (every product, quotient and fma spelled
// with its _rn intrinsic, so nvcc cannot contract or approximate them), so
// a block written on a GPU has the bytes a CPU rank writes from the same
// f32 values, and KV transfer may pair the two.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/kv_layout.h"

namespace headway::cuda {

// Bytes of one row of head_dim values in `dtype` (KvCacheLayout::RowBytes).
__host__ __device__ inline int KvRowBytes(KvCacheDtype dtype, int head_dim) {
  switch (dtype) {
    case KvCacheDtype::kFloat32:
      return 4 * head_dim;
    case KvCacheDtype::kFloat16:
      return 2 * head_dim;
    case KvCacheDtype::kQ8_0:
      return head_dim / 32 * 34;
    case KvCacheDtype::kQ4_0:
    case KvCacheDtype::kQ4_0Hadamard:
      return head_dim / 32 * 18;
  }
  return 0;
}

__device__ inline float LoadHalf(const uint8_t* p) {  // p 2-byte aligned
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// Values [4c, 4c + 4) of a row in `kDtype`, as f32. q4_0_hadamard gives the
// still-rotated values (readers rotate queries and outputs instead).
// REQUIRES: the row 8-byte aligned for float16, 2-byte aligned otherwise
// (rows of a pool are: every block and row size is a multiple of 8 or 2).
template <KvCacheDtype kDtype>
__device__ inline float4 DecodeKv4(const uint8_t* row, int c) {
  if constexpr (kDtype == KvCacheDtype::kFloat32) {
    return reinterpret_cast<const float4*>(row)[c];
  } else if constexpr (kDtype == KvCacheDtype::kFloat16) {
    const uint2 bits = reinterpret_cast<const uint2*>(row)[c];
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&bits.x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&bits.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  } else if constexpr (kDtype == KvCacheDtype::kQ8_0) {
    const int i = 4 * c;
    const uint8_t* group = row + (i / 32) * 34;
    const float d = LoadHalf(group);
    const int8_t* q = reinterpret_cast<const int8_t*>(group + 2 + i % 32);
    return make_float4(__fmul_rn(d, float(q[0])), __fmul_rn(d, float(q[1])),
                       __fmul_rn(d, float(q[2])), __fmul_rn(d, float(q[3])));
  } else {  // q4_0, q4_0_hadamard
    const int i = 4 * c;
    const uint8_t* group = row + (i / 32) * 18;
    const float d = LoadHalf(group);
    const int j = i % 32;
    const uint8_t* qs = group + 2 + (j & 15);
    const int shift = j < 16 ? 0 : 4;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __fmul_rn(d, float(((qs[k] >> shift) & 15) - 8));
    return make_float4(v[0], v[1], v[2], v[3]);
  }
}

// x[32] times the Hadamard matrix over sqrt(32), as common/kv_layout.h's
// q4_0_hadamard defines it (5 butterfly stages, then the f32 scale): bit for
// bit reference::Hadamard32Groups on one group. Its own inverse.
__device__ inline void Hadamard32(float* x) {
  for (int step = 1; step < 32; step *= 2) {
    for (int i = 0; i < 32; ++i) {
      if (i & step) continue;
      const float a = x[i], b = x[i + step];
      x[i] = __fadd_rn(a, b);
      x[i + step] = __fsub_rn(a, b);
    }
  }
  const float scale = 0.17677669529663688f;  // float(1 / sqrt(32.0))
  for (int i = 0; i < 32; ++i) x[i] = __fmul_rn(x[i], scale);
}

// Encodes group `g` (values [32g, 32g + 32)) of the f32 row `x` into `row`
// in a q dtype; x is modified for q4_0_hadamard (rotated in place). One
// thread per group. Bits equal reference::QuantizeKvRow's.
template <KvCacheDtype kDtype>
__device__ inline void EncodeKvGroup(float* x, int g, uint8_t* row) {
  float* v = x + 32 * g;
  if constexpr (kDtype == KvCacheDtype::kQ8_0) {
    uint8_t* out = row + 34 * g;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    *reinterpret_cast<unsigned short*>(out) = __half_as_ushort(__float2half_rn(d));
    for (int i = 0; i < 32; ++i) {
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(rintf(__fmul_rn(v[i], id))));
    }
  } else {  // q4_0, q4_0_hadamard
    if constexpr (kDtype == KvCacheDtype::kQ4_0Hadamard) Hadamard32(v);
    uint8_t* out = row + 18 * g;
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (fabsf(v[i]) > amax) {
        amax = fabsf(v[i]);
        m = v[i];
      }
    }
    const float d = __fdiv_rn(m, -8.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    *reinterpret_cast<unsigned short*>(out) = __half_as_ushort(__float2half_rn(d));
    for (int i = 0; i < 16; ++i) {
      const int lo = min(15, static_cast<int>(floorf(__fmaf_rn(v[i], id, 8.5f))));
      const int hi = min(15, static_cast<int>(floorf(__fmaf_rn(v[i + 16], id, 8.5f))));
      out[2 + i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Encodes `num_rows` f32 rows x[num_rows][head_dim] (shared memory) into
// rows at row, row + row_stride, ... (bytes), the threads of the CTA sharing
// the work: one value each for the float dtypes, one group of 32 each for
// the q dtypes. x may be modified (q4_0_hadamard rotates it); the caller
// synchronises before x is reused.
template <KvCacheDtype kDtype>
__device__ inline void EncodeKvRowsCta(float* x, int num_rows, int head_dim, uint8_t* row,
                                       size_t row_stride) {
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  if constexpr (kDtype == KvCacheDtype::kFloat32 || kDtype == KvCacheDtype::kFloat16) {
    for (int i = tid; i < num_rows * head_dim; i += threads) {
      const int r = i / head_dim;
      const int d = i - r * head_dim;
      uint8_t* dst = row + r * row_stride;
      if constexpr (kDtype == KvCacheDtype::kFloat32) {
        reinterpret_cast<float*>(dst)[d] = x[i];
      } else {
        reinterpret_cast<unsigned short*>(dst)[d] = __half_as_ushort(__float2half_rn(x[i]));
      }
    }
  } else {
    const int groups = head_dim / 32;
    for (int i = tid; i < num_rows * groups; i += threads) {
      const int r = i / groups;
      EncodeKvGroup<kDtype>(x + r * head_dim, i - r * groups, row + r * row_stride);
    }
  }
}

// Calls f(std::integral_constant<KvCacheDtype, d>{}) for the run-time dtype:
// how host code picks a kernel instantiation.
template <typename F>
void DispatchKvDtype(KvCacheDtype dtype, F&& f) {
  switch (dtype) {
    case KvCacheDtype::kFloat32:
      return f(std::integral_constant<KvCacheDtype, KvCacheDtype::kFloat32>{});
    case KvCacheDtype::kFloat16:
      return f(std::integral_constant<KvCacheDtype, KvCacheDtype::kFloat16>{});
    case KvCacheDtype::kQ8_0:
      return f(std::integral_constant<KvCacheDtype, KvCacheDtype::kQ8_0>{});
    case KvCacheDtype::kQ4_0:
      return f(std::integral_constant<KvCacheDtype, KvCacheDtype::kQ4_0>{});
    case KvCacheDtype::kQ4_0Hadamard:
      return f(std::integral_constant<KvCacheDtype, KvCacheDtype::kQ4_0Hadamard>{});
  }
}

}  // namespace headway::cuda
