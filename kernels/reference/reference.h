// Naive reference kernels: the obvious loops, used only by tests to check the
// optimised backends (kernels/cpu, kernels/cuda). Same contracts as the
// headers they mirror.
#pragma once

#include <cstdint>

#include "kernels/elementwise.h"
#include "kernels/kv_cache.h"
#include "kernels/sampling.h"

namespace headway::reference {

void Embedding(const float* table, const int32_t* ids, int n, int dim, float* out);
void RmsNorm(const float* x, const float* weight, int n_rows, int dim, float eps, float* out);
void Rope(float* x, const int32_t* positions, int n_tokens, int n_heads, int head_dim,
          float freq_base, cpu::RopeStyle style);
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);
void GeluTanhGated(const float* gate, const float* up, int64_t n, float* out);
void MatmulTransB(const float* x, const float* w, int m, int n, int k, float* y);

// Attention computed from contiguous per-sequence K/V histories, not the pool:
//   k_hist, v_hist: per sequence s, [context_len[s], num_kv_heads, head_dim],
//   concatenated over sequences (context_len[s] = start_pos[s] + new tokens).
// Materialises all scores and applies a plain softmax.
void Attention(const float* q, const float* k_hist, const float* v_hist,
               const BatchLayout& batch, const SlotSpec* specs, int num_heads,
               int num_kv_heads, int head_dim, float scale, float* out);

// One K or V row in the KV cache dtype `dtype`, by the definitions of
// common/kv_layout.h, one value at a time: what the CPU and CUDA append_kv
// kernels must write bit for bit.
//   x:   [head_dim] f32
//   row: [KvCacheLayout{.., head_dim, dtype}.RowBytes()] bytes
// REQUIRES: head_dim a multiple of KvCacheDtypeGroup(dtype).
void QuantizeKvRow(const float* x, int head_dim, KvCacheDtype dtype, uint8_t* row);
// The values a row holds (exact: every code maps to one f32).
void DequantizeKvRow(const uint8_t* row, int head_dim, KvCacheDtype dtype, float* x);
// x [n] (n a multiple of 32): each group of 32 values multiplied by the
// Hadamard matrix over sqrt(32), as common/kv_layout.h's q4_0_hadamard
// defines it (f32 butterflies, then the scale). Its own inverse.
void Hadamard32Groups(float* x, int n);
// IEEE 754 binary32 to binary16, rounding to nearest even; overflow gives
// infinity, NaN stays NaN.
uint16_t FloatToHalf(float f);

// Sorts the whole vocabulary and applies the same rules as cpu::Sample.
SampleResult Sample(const float* logits, int vocab_size, const SamplingConfig& config,
                    double uniform, int num_top_logprobs);

}  // namespace headway::reference
