// Embedding, RMSNorm, RoPE, the gated MLP activations and small vector ops
// on a CUDA device: the contracts of kernels/elementwise.h (the CPU
// backend), on device memory. Activations are f32; weights that are
// matrices are bf16 (kernels/cuda/bf16.h); norm weights stay f32.
//
// Every function only enqueues a kernel on `stream` (kernels/cuda/runtime.h
// says how errors surface). All pointers are device memory. n == 0 launches
// nothing.
#pragma once

#include <cstdint>

#include "kernels/cuda/bf16.h"
#include "kernels/cuda/runtime.h"
#include "kernels/elementwise.h"

namespace headway::cuda {

// Vocab-parallel embedding (see cpu::EmbeddingShard): this rank holds rows
// [row_begin, row_end); other tokens get a zero row.
//   table: [row_end - row_begin, dim] bf16; ids: [n]; out: [n, dim] f32
//   scale: multiplies every value (Gemma's sqrt(hidden); 1 otherwise)
void EmbeddingShard(const bf16_bits* table, int row_begin, int row_end, const int32_t* ids,
                    int n, int dim, float scale, float* out, Stream stream);
// The same from an f32 table ([row_end - row_begin, dim] f32): the exact
// values of a quantised table, for checks against the CPU worker.
void EmbeddingShard(const float* table, int row_begin, int row_end, const int32_t* ids, int n,
                    int dim, float scale, float* out, Stream stream);

// RMSNorm (Zhang & Sennrich 2019), as cpu::RmsNorm: one CTA per row, f32
// sums. x, out: [n_rows, dim] f32 (may alias); weight: [dim] f32.
void RmsNorm(const float* x, const float* weight, int n_rows, int dim, float eps, float* out,
             Stream stream);

// x += residual-free add: out[i] += x[i]; then RmsNorm of out into normed.
// The pre-norm transformer's "residual add, then norm" in one pass.
//   out: [n_rows, dim] f32 (updated); x: [n_rows, dim]; weight: [dim];
//   normed: [n_rows, dim] (must not alias out or x)
void AddRmsNorm(float* out, const float* x, const float* weight, int n_rows, int dim, float eps,
                float* normed, Stream stream);

// RoPE in place, as cpu::Rope (same angles, both pair styles).
//   x: [n_tokens, n_heads, head_dim] f32; positions: [n_tokens]
void Rope(float* x, const int32_t* positions, int n_tokens, int n_heads, int head_dim,
          float freq_base, cpu::RopeStyle style, Stream stream);

// out = silu(gate) * up and out = gelu_tanh(gate) * up, as the CPU versions.
//   gate, up, out: [n] f32 (out may alias gate)
void SwiGlu(const float* gate, const float* up, int64_t n, float* out, Stream stream);
void GeluTanhGated(const float* gate, const float* up, int64_t n, float* out, Stream stream);

// out += x over n values.
void AddInPlace(float* out, const float* x, int64_t n, Stream stream);

// Rows of `in` picked by `rows`: out[i, :] = in[rows[i], :].
//   in: [*, dim] f32; rows: [n] (device); out: [n, dim]
void GatherRows(const float* in, const int32_t* rows, int n, int dim, float* out, Stream stream);

// f32 -> bf16 (round to nearest even), the activations fed to bf16 GEMMs.
void F32ToBf16(const float* in, int64_t n, bf16_bits* out, Stream stream);

}  // namespace headway::cuda
