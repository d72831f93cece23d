#include "worker/dequant.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/threads.h"

namespace headway {
namespace {

// Below this many blocks the thread start-up costs more than it saves.
constexpr uint64_t kMinBlocksForThreads = 2048;

constexpr int kQK = 32;    // values per block of the *_0 / *_1 types
constexpr int kQKK = 256;  // values per super-block of the K types

using quant::LoadU16;
using quant::ScaleMinK4;

// f(i) for i in [0, n), split across the compute threads from
// `min_for_threads` items on (cpu::ParallelFor).
template <class F>
void ForEach(uint64_t n, uint64_t min_for_threads, F&& f) {
  cpu::ParallelFor(int64_t(n), int64_t(std::max<uint64_t>(1, min_for_threads / 2)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) f(uint64_t(i));
                   });
}

// Each DequantizeBlocks* turns blocks [0, n_blocks) of `src` into `dst`.
// Formulas follow ggml-quants.c dequantize_row_*.

void DequantizeF32(const uint8_t* src, float* dst, uint64_t n) { std::memcpy(dst, src, n * 4); }

void DequantizeF16(const uint8_t* src, float* dst, uint64_t n) {
  ForEach(n, kMinBlocksForThreads * 32, [&](uint64_t i) {
    dst[i] = HalfToFloat(LoadU16(src + 2 * i));
  });
}

void DequantizeBF16(const uint8_t* src, float* dst, uint64_t n) {
  ForEach(n, kMinBlocksForThreads * 32, [&](uint64_t i) {
    dst[i] = BFloat16ToFloat(LoadU16(src + 2 * i));
  });
}

// Q8_0: f16 d | i8 qs[32].
void DequantizeQ8_0(const uint8_t* src, float* dst, uint64_t n_blocks) {
  ForEach(n_blocks, kMinBlocksForThreads, [&](uint64_t b) {
    const uint8_t* block = src + b * 34;
    const float d = HalfToFloat(LoadU16(block));
    const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
    float* y = dst + b * kQK;
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
  });
}

// Q4_0: f16 d | u8 qs[16].
void DequantizeQ4_0(const uint8_t* src, float* dst, uint64_t n_blocks) {
  ForEach(n_blocks, kMinBlocksForThreads, [&](uint64_t b) {
    const uint8_t* block = src + b * 18;
    const float d = HalfToFloat(LoadU16(block));
    const uint8_t* qs = block + 2;
    float* y = dst + b * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  });
}

// Q4_1: f16 d | f16 m | u8 qs[16].
void DequantizeQ4_1(const uint8_t* src, float* dst, uint64_t n_blocks) {
  ForEach(n_blocks, kMinBlocksForThreads, [&](uint64_t b) {
    const uint8_t* block = src + b * 20;
    const float d = HalfToFloat(LoadU16(block));
    const float m = HalfToFloat(LoadU16(block + 2));
    const uint8_t* qs = block + 4;
    float* y = dst + b * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  });
}

// Q5_0: f16 d | u8 qh[4] | u8 qs[16]. Bit j of qh is the 5th bit of value j.
void DequantizeQ5_0(const uint8_t* src, float* dst, uint64_t n_blocks) {
  ForEach(n_blocks, kMinBlocksForThreads, [&](uint64_t b) {
    const uint8_t* block = src + b * 22;
    const float d = HalfToFloat(LoadU16(block));
    uint32_t qh;
    std::memcpy(&qh, block + 2, 4);
    const uint8_t* qs = block + 6;
    float* y = dst + b * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      const int xh0 = ((qh >> j) << 4) & 0x10;
      const int xh1 = (qh >> (j + 12)) & 0x10;
      y[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
      y[j + kQK / 2] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
    }
  });
}

// Q4_K: f16 d | f16 dmin | u8 scales[12] | u8 qs[128].
void DequantizeQ4_K(const uint8_t* src, float* dst, uint64_t n_blocks) {
  ForEach(n_blocks, kMinBlocksForThreads / 8, [&](uint64_t b) {
    const uint8_t* block = src + b * 144;
    const float d = HalfToFloat(LoadU16(block));
    const float dmin = HalfToFloat(LoadU16(block + 2));
    const uint8_t* scales = block + 4;
    const uint8_t* q = block + 16;
    float* y = dst + b * kQKK;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
      int sc = 0, m = 0;
      ScaleMinK4(is, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      ScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc);
      const float m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) y[j + l] = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) y[j + 32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  });
}

// Q6_K: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d.
void DequantizeQ6_K(const uint8_t* src, float* dst, uint64_t n_blocks) {
  ForEach(n_blocks, kMinBlocksForThreads / 8, [&](uint64_t b) {
    const uint8_t* block = src + b * 210;
    const uint8_t* ql = block;
    const uint8_t* qh = block + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
    const float d = HalfToFloat(LoadU16(block + 208));
    float* y = dst + b * kQKK;
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  });
}

// What the quantised kernels read, plus the plain float types.
bool Supported(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kBF16 || quant::IsKernelBlockType(type);
}

Result<GgmlTypeSize> SupportedSize(GgmlType type) {
  if (!Supported(type)) {
    return Status::Unimplemented("Headway cannot dequantise ggml type " + GgmlTypeName(type) +
                                 " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)");
  }
  return GgmlTypeSizeOf(type);
}

}  // namespace

float BFloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Result<uint64_t> GgmlBlockValues(GgmlType type) {
  HW_ASSIGN_OR_RETURN(GgmlTypeSize size, SupportedSize(type));
  return size.block_values;
}

Result<uint64_t> GgmlBytes(GgmlType type, uint64_t n_values) {
  HW_ASSIGN_OR_RETURN(GgmlTypeSize size, SupportedSize(type));
  if (n_values % size.block_values != 0) {
    return Status::InvalidArgument(std::to_string(n_values) + " values of " + GgmlTypeName(type) +
                                   " are not a multiple of its block of " +
                                   std::to_string(size.block_values));
  }
  return n_values / size.block_values * size.block_bytes;
}

Status Dequantize(GgmlType type, const uint8_t* src, float* dst, uint64_t n_values) {
  HW_ASSIGN_OR_RETURN(GgmlTypeSize size, SupportedSize(type));
  if (n_values % size.block_values != 0) {
    return Status::InvalidArgument("cannot dequantise " + std::to_string(n_values) +
                                   " values of " + GgmlTypeName(type) +
                                   ": not a multiple of its block of " +
                                   std::to_string(size.block_values));
  }
  const uint64_t n_blocks = n_values / size.block_values;
  switch (type) {
    case GgmlType::kF32: DequantizeF32(src, dst, n_values); break;
    case GgmlType::kF16: DequantizeF16(src, dst, n_values); break;
    case GgmlType::kBF16: DequantizeBF16(src, dst, n_values); break;
    case GgmlType::kQ8_0: DequantizeQ8_0(src, dst, n_blocks); break;
    case GgmlType::kQ4_0: DequantizeQ4_0(src, dst, n_blocks); break;
    case GgmlType::kQ4_1: DequantizeQ4_1(src, dst, n_blocks); break;
    case GgmlType::kQ5_0: DequantizeQ5_0(src, dst, n_blocks); break;
    case GgmlType::kQ4_K: DequantizeQ4_K(src, dst, n_blocks); break;
    case GgmlType::kQ6_K: DequantizeQ6_K(src, dst, n_blocks); break;
    default: return Status::Internal("dequantiser missing for " + GgmlTypeName(type));
  }
  return Status::Ok();
}

}  // namespace headway
