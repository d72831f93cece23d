// llama.cpp's quantised matrix product, which rounds the activations to 8
// bits per block before integer dot products. Serving keeps activations in
// f32 (kernels/quant_matmul.h, worker/linear.h says why); this one stays as
// the reference for how llama.cpp computes, for tests that compare with
// llama.cpp's logits and for the matmul benchmark. Weight layouts, shapes and
// the types handled are those of cpu::QuantMatmulTransBF32Act.
//
// Method (llama.cpp's ggml_vec_dot_q4_1_q8_1 and friends): each activation
// row is quantised once per call to 8-bit blocks of 32 (per block
// dx = max|x| / 127, qx = round(x / dx), sx = dx * sum(qx)); a block's
// product is then an exact integer dot sum(qw * qx), scaled in f32:
//   Q8_0: dw*dx*dot                 Q4_1: dw*dx*dot + m*sx
//   Q4_0: dw*dx*dot - 8*dw*sx       Q5_0: dw*dx*dot - 16*dw*sx
// The K types go one 32-value sub-block (one activation block) at a time:
//   Q4_K: (d*sc_s)*dx*dot - (dmin*m_s)*sx
//   Q6_K: d*dx*(sc_a*dot_a + sc_b*dot_b), dot over the signed q - 32, a and b
//         the sub-block's two 16-value halves (the scale products are integer)
// F16 weights multiply the f32 activations directly (no activation rounding).
//
// Accuracy against the exact product with the dequantised weights W: rounding
// x to qx moves each value by at most dx/2 = max_b|x| / 254, so a block b
// adds at most (max_{j in b}|x_j| / 254) * sum_{j in b}|W_j| of error, plus
// f32 rounding of the accumulation. Activation quantisation is the only
// approximation; weights are used exactly as stored.
#pragma once

#include <cstdint>

#include "common/gguf.h"

namespace headway::reference {

// y = x * W^T with W stored quantised and x rounded to 8-bit blocks:
//   x: [m, k] f32 row-major; y: [m, n] f32 row-major (overwritten);
//   w_quant: n rows of k values of `w_type` (kernels/quant_matmul.h layouts).
// Parallel over output rows n with OpenMP (the calling thread's team size);
// each weight row is read once and reused for all m activation rows. Scratch
// of about m * (k + k / 4) bytes is allocated per call. Thread-safe for
// distinct y. m == 0 or n == 0 writes nothing; k == 0 writes zeros.
// REQUIRES: cpu::QuantMatmulSupported(w_type), k % 32 == 0 (k % 256 == 0 for
// Q4_K and Q6_K), m, n, k >= 0 (checked: a violation aborts, as it is a
// caller's bug).
void QuantMatmulTransB8BitAct(const float* x, const uint8_t* w_quant, GgmlType w_type, int m,
                              int n, int k, float* y);

namespace internal {

// The portable path, which QuantMatmulTransB8BitAct uses where AVX2 is not
// compiled in; same contract. Exposed so tests can check that both paths give
// the same bits (they share the summation order: 8 lanes per block, one f32
// FMA per lane and block, then a fixed pairwise reduction).
void QuantMatmulTransB8BitActPortable(const float* x, const uint8_t* w_quant, GgmlType w_type,
                                      int m, int n, int k, float* y);

// True where QuantMatmulTransB8BitAct runs the AVX2 path.
bool QuantMatmul8BitActHasSimd();

}  // namespace internal
}  // namespace headway::reference
