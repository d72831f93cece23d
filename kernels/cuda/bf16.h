// bfloat16 as raw bits in host code: the type of weights on CUDA devices.
// bf16 is the top 16 bits of an IEEE f32 (1 sign, 8 exponent, 7 mantissa
// bits); device code reads these bits as __nv_bfloat16. Conversion rounds to
// nearest, ties to even, as __float2bfloat16 does; NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace headway {

using bf16_bits = uint16_t;

inline bf16_bits FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return bf16_bits((u >> 16) | 0x0040u);  // quiet NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_bits(u >> 16);
}

inline float Bf16ToFloat(bf16_bits b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace headway
