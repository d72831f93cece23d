// Embedding lookup, RMSNorm, RoPE and the gated MLP activations (CPU, f32,
// host memory).
#pragma once

#include <cstdint>
#include <vector>

namespace headway::cpu {

// out[i, :] = table[ids[i], :].
//   table: [vocab_size, dim] f32; ids: [n] with 0 <= id < vocab_size; out: [n, dim]
void Embedding(const float* table, const int32_t* ids, int n, int dim, float* out);

// Vocab-parallel embedding (Megatron-LM, Shoeybi et al. 2019, sec. 3): this
// rank holds rows [row_begin, row_end) of the table; a token outside the range
// gets a zero row, so the sum over ranks (an all-reduce) is the full lookup.
//   table: [row_end - row_begin, dim] f32; ids: [n], each >= 0; out: [n, dim]
void EmbeddingShard(const float* table, int row_begin, int row_end, const int32_t* ids, int n,
                    int dim, float* out);

// RMSNorm (Zhang & Sennrich 2019): out = x / sqrt(mean(x^2) + eps) * weight.
//   x, out: [n_rows, dim] f32 (may alias); weight: [dim]
void RmsNorm(const float* x, const float* weight, int n_rows, int dim, float eps, float* out);

enum class RopeStyle {
  kInterleaved,  // rotate pairs (x[2i], x[2i+1]): llama.cpp GGML_ROPE_TYPE_NORM,
                 // what GGUF llama weights need (the converter permutes Q/K rows)
  kNeox,         // rotate pairs (x[i], x[i + d/2]): GGML_ROPE_TYPE_NEOX
};

// Rotary position embedding (Su et al. 2021, RoFormer), in place:
// pair i of a head at position p turns by angle p * freq_base^(-2i/head_dim).
//   x: [n_tokens, n_heads, head_dim] f32; positions: [n_tokens]
// REQUIRES: head_dim even.
void Rope(float* x, const int32_t* positions, int n_tokens, int n_heads, int head_dim,
          float freq_base, RopeStyle style);

// The cos and sin of every angle Rope turns by, for a batch of positions:
// the same for every layer with the same freq_base and for Q and K, so a
// forward pass computes them once per base instead of twice per layer
// (each is a double-precision sin and cos: positions reach 1e5 and more,
// where f32 angles drift).
//   cos, sin: [n_tokens, head_dim / 2] f32, row t for positions[t].
struct RopeAngles {
  int n_tokens = 0;
  int head_dim = 0;
  float freq_base = 0.0f;
  std::vector<float> cos, sin;
};

// Fills `out` for positions [n_tokens] (reusing its storage).
// REQUIRES: head_dim even, n_tokens >= 0.
void ComputeRopeAngles(const int32_t* positions, int n_tokens, int head_dim, float freq_base,
                       RopeAngles* out);

// Rope with precomputed angles: the same bits as Rope(x, positions, ...)
// for the positions, head_dim and freq_base `angles` was computed for.
//   x: [angles.n_tokens, n_heads, angles.head_dim] f32
void Rope(float* x, const RopeAngles& angles, int n_heads, RopeStyle style);

// SwiGLU (Shazeer 2020): out = silu(gate) * up, silu(x) = x / (1 + e^-x).
//   gate, up, out: [n] f32 (out may alias gate)
// e^-x has relative error below 1e-7 (kernels/cpu/exp_avx2.h); tests hold
// out to 1e-5 |out| + 1e-6 of a double-precision reference. A value's
// result does not depend on n or on its index.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

// GeGLU with the tanh approximation of GELU (Shazeer 2020; Gemma's
// `gelu_pytorch_tanh`, llama.cpp ggml_gelu): out = gelu(gate) * up,
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//   gate, up, out: [n] f32 (out may alias gate)
// Computed as x / (1 + e^(-2u)), u the tanh argument, the identity
// 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), with an exponential of relative
// error below 1e-7 (kernels/cpu/exp_avx2.h), and free of the
// cancellation 1 + tanh(u) has for negative x; tests hold it to
// 1e-5 |out| + 1e-6 of a double-precision reference. A value's result does
// not depend on n or on its index.
void GeluTanhGated(const float* gate, const float* up, int64_t n, float* out);

// out *= scale, elementwise over n values.
void ScaleInPlace(float* out, float scale, int64_t n);

// out += x, elementwise over n values.
void AddInPlace(float* out, const float* x, int64_t n);

}  // namespace headway::cpu
