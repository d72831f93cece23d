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

// Sorts the whole vocabulary and applies the same rules as cpu::Sample.
SampleResult Sample(const float* logits, int vocab_size, const SamplingConfig& config,
                    double uniform, int num_top_logprobs);

}  // namespace headway::reference
