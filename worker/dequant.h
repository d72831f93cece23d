// Dequantisation of ggml tensor types to f32.
//
// Block layouts follow ggml (ggml-common.h, ggml-quants.c):
//   Q8_0: 32 values = f16 d | i8 qs[32];                    x = d * q
//   Q4_0: 32 values = f16 d | u8 qs[16] (low nibbles = values 0..15,
//         high nibbles = 16..31);                            x = d * (q - 8)
//   Q4_1: 32 values = f16 d | f16 m | u8 qs[16];             x = d * q + m
//   Q5_0: 32 values = f16 d | u8 qh[4] (5th bits) | u8 qs[16]; x = d * (q - 16)
//   Q4_K: 256 values = f16 d | f16 dmin | u8 scales[12] (6-bit scales and
//         mins of 8 sub-blocks) | u8 qs[128];  x = d*sc*q - dmin*m
//   Q6_K: 256 values = u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d;
//         x = d * scale * (q - 32)
//   F16, BF16, F32: plain little-endian values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/gguf.h"
#include "common/status.h"
#include "kernels/quant_blocks.h"

namespace headway {

// Values per quantisation block of `type` (1 for F32/F16/BF16).
// Unimplemented for types Headway cannot dequantise.
Result<uint64_t> GgmlBlockValues(GgmlType type);

// Bytes of `n_values` values of `type`. InvalidArgument if n_values is not a
// multiple of the block size; Unimplemented for unsupported types.
Result<uint64_t> GgmlBytes(GgmlType type, uint64_t n_values);

// Dequantises `n_values` values from `src` (laid out as ggml stores them) into
// `dst` (f32, n_values long). REQUIRES: n_values multiple of the block size.
// Errors: InvalidArgument (bad count), Unimplemented (unsupported type).
Status Dequantize(GgmlType type, const uint8_t* src, float* dst, uint64_t n_values);

// IEEE half to float, exact: the kernels' own (kernels/quant_blocks.h).
using quant::HalfToFloat;
// bfloat16 to float, exact.
float BFloat16ToFloat(uint16_t h);

}  // namespace headway
