// Geometry and scalar helpers of the ggml block types that Headway's quantised
// kernels read, shared by the CPU kernels (kernels/quant_matmul.h), the CUDA
// dequantising GEMV (kernels/cuda/matmul.h) and the loader's dequantiser
// (worker/dequant.h), which draw the block layouts. IsKernelBlockType is the
// one list of those types (cpu::QuantMatmulSupported,
// cuda::DequantGemvSupported). Header-only and host-only, so that no backend
// library depends on another.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/gguf.h"

namespace headway::quant {

// Values per block: 256 for the K types' super-blocks, 32 otherwise (F16
// counts as blocks of 32 values); 0 if unsupported.
constexpr int BlockValues(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kF16: return 32;
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K: return 256;
    default: return 0;
  }
}

// Bytes of one block of BlockValues(type) values; 0 if unsupported.
constexpr int BlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return 34;
    case GgmlType::kQ4_0: return 18;
    case GgmlType::kQ4_1: return 20;
    case GgmlType::kQ5_0: return 22;
    case GgmlType::kF16: return 64;
    case GgmlType::kQ4_K: return 144;
    case GgmlType::kQ6_K: return 210;
    default: return 0;
  }
}

// True for the types the quantised kernels read: Q8_0, Q4_0, Q4_1, Q5_0, F16
// (blocks of 32 values) and Q4_K, Q6_K (super-blocks of 256 values).
constexpr bool IsKernelBlockType(GgmlType type) { return BlockBytes(type) != 0; }

// Byte offsets inside a Q4_K super-block (f16 d | f16 dmin | u8 scales[12] |
// u8 qs[128]) and a Q6_K one (u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d).
constexpr int kQ4KScales = 4;
constexpr int kQ4KQs = 16;
constexpr int kQ6KQh = 128;
constexpr int kQ6KScales = 192;
constexpr int kQ6KD = 208;

// The 6-bit scale and min of 32-value sub-block j (0..7) of a Q4_K
// super-block whose 12 packed scale bytes start at `q` (ggml-quants.c
// get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 in
// the nibbles of byte j + 4 with the top 2 bits of bytes j - 4 and j.
inline void ScaleMinK4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// IEEE 754 half to float, exact (subnormals, infinities and NaN included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x03FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x0400) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x03FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace headway::quant
