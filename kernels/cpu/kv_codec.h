// The KV cache dtypes' rows (common/kv_layout.h) written and read by the CPU
// attention kernels, with AVX2 and F16C. Bits equal reference::QuantizeKvRow
// and reference::DequantizeKvRow.
#pragma once

#include <cstdint>

#include "common/kv_layout.h"

namespace headway::cpu {

// Encodes one head vector x [head_dim] f32 into `row`
// (KvCacheLayout::RowBytes() bytes).
// REQUIRES: head_dim a multiple of KvCacheDtypeGroup(dtype) and of 8.
void EncodeKvRow(const float* x, int head_dim, KvCacheDtype dtype, uint8_t* row);

// Decodes `n` consecutive rows starting at `rows` (RowBytes() apart) into
// out [n, head_dim] f32. Not for float32, whose rows are read in place.
// q4_0_hadamard rows decode to the rotated values (Hadamard32Groups gives
// back the originals): attention rotates its queries and outputs instead.
// REQUIRES: as EncodeKvRow.
void DecodeKvRows(const uint8_t* rows, int n, int head_dim, KvCacheDtype dtype, float* out);

// x [n] (n a multiple of 32): each group of 32 values times the Hadamard
// matrix over sqrt(32), as common/kv_layout.h's q4_0_hadamard defines it,
// bit for bit. Its own inverse.
void Hadamard32Groups(float* x, int64_t n);

}  // namespace headway::cpu
