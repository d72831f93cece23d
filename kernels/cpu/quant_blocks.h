// Block geometry and scalar helpers shared by the quantised matmul kernels
// (kernels/quant_matmul.h). Internal to kernels/cpu; kernels/ cannot use
// worker/dequant.h, which draws the same layouts for loading.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/gguf.h"

namespace headway::cpu::internal {

// Bytes of one 32-value block (F16: 32 values of 2 bytes); 0 if unsupported.
constexpr int BlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return 34;
    case GgmlType::kQ4_0: return 18;
    case GgmlType::kQ4_1: return 20;
    case GgmlType::kQ5_0: return 22;
    case GgmlType::kF16: return 64;
    default: return 0;
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

}  // namespace headway::cpu::internal
