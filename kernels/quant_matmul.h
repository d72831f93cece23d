// Matrix products against weights kept in ggml's quantised block formats:
// each weight byte is read once per call instead of the 4 bytes per weight of
// a dequantised f32 matrix, and no f32 copy of the weights is kept.
//
// Weight row layouts (ggml-common.h; worker/dequant.h draws the same blocks):
//   Q8_0: 34 bytes per 32 values = f16 d | i8 qs[32];                 w = d*q
//   Q4_0: 18 bytes per 32 values = f16 d | u8 qs[16];           w = d*(q - 8)
//   Q4_1: 20 bytes per 32 values = f16 d | f16 m | u8 qs[16];       w = d*q + m
//   Q5_0: 22 bytes per 32 values = f16 d | u8 qh[4] | u8 qs[16]; w = d*(q - 16)
//   Q4_K: 144 bytes per 256 values = f16 d | f16 dmin | u8 scales[12] |
//         u8 qs[128];              w = (d*sc_s)*q - dmin*m_s in sub-block s
//   Q6_K: 210 bytes per 256 values = u8 ql[128] | u8 qh[64] | i8 scales[16] |
//         f16 d;                            w = d*sc_t*(q - 32), t = j / 16
//   F16:   2 bytes per value.
// In the 4-bit types the low nibbles of qs hold values 0..15 of the block and
// the high nibbles values 16..31; bit j of Q5_0's qh is the 5th bit of value j.
// Q4_K has 8 sub-blocks of 32 values with 6-bit scale sc_s and min m_s
// (packed in scales[12] as ggml-quants.c get_scale_min_k4): sub-blocks 2p and
// 2p + 1 are the low and high nibbles of qs[32p .. 32p + 31]. Q6_K value j in
// half h = j / 128, quarter g = (j % 128) / 32, l = j % 32 has its low 4 bits
// in ql[64h + 32(g % 2) + l] (low nibble for g < 2, high for g >= 2) and its
// top 2 bits in bits 2g, 2g + 1 of qh[32h + l]; one scale per 16 values.
//
// The activations stay f32. llama.cpp's method, which rounds them to 8 bits
// per block first, is kernels/reference/quant_matmul_8bit_act.h: it moves
// logits enough to flip near-ties (worker/linear.h), so serving does not use it.
#pragma once

#include <cstdint>

#include "common/gguf.h"

namespace headway::cpu {

// True for the weight types QuantMatmulTransBF32Act handles: Q8_0, Q4_0, Q4_1,
// Q5_0, F16 (blocks of 32 values) and Q4_K, Q6_K (super-blocks of 256 values),
// the list of kernels/quant_blocks.h (quant::IsKernelBlockType).
bool QuantMatmulSupported(GgmlType type);

// y = x * W^T with W stored quantised, the layout of a linear layer whose
// weight rows are outputs (GGUF's ne = {k, n}), and the activations in f32:
//   x: [m, k] f32 row-major; y: [m, n] f32 row-major (overwritten);
//   w_quant: n rows of k values of `w_type`, row i starting at byte
//            i * row_bytes, row_bytes = k / block values * block bytes
//            (block values 256 for Q4_K and Q6_K, else 32; F16: 2 * k).
// Parallel over output rows n on the calling thread's pool (kernels/threads.h).
// Thread-safe for distinct y. m == 0 or n == 0 writes nothing; k == 0 writes
// zeros. REQUIRES: QuantMatmulSupported(w_type), k % 32 == 0 (k % 256 == 0
// for Q4_K and Q6_K), m, n, k >= 0 (checked: a violation aborts, as it is a
// caller's bug; validate types and shapes when the weights are loaded).
//
// Each weight block is dequantised in registers and multiplied with x by
// FMA, accumulating in f32. For decode batches (m <= 8) it reads the
// quantised bytes once and is memory-bound; for m > 8 each group of weight
// rows is dequantised once per call into a per-thread f32 scratch of
// max(192 KiB, 12 * k bytes) and reused by all m rows.
//
// Weights: w = d*q (Q8_0), d*(q - 8) (Q4_0), d*(q - 16) (Q5_0), the f16
// value (F16), (d*sc_t)*(q - 32) (Q6_K), each exact in f32, fma(d, q, m)
// (Q4_1), the f32 nearest to d*q + m, and fma(d*sc_s, q, -(dmin*m_s))
// (Q4_K; d*sc_s and dmin*m_s are exact), the f32 nearest to the exact value;
// these are the values worker/dequant.h produces when its d*q + m is
// contracted to an FMA, as at -march=x86-64-v3 (for Q4_K and Q6_K whether or
// not it is, as the products before the last step are exact). K super-blocks
// are dequantised 32 values at a time, which does not change the order below.
//
// Summation order, fixed per output so that results are batch-invariant:
// y[r, i] depends only on x[r, :] and weight row i, bit for bit, whatever m,
// whatever the other rows of x, and whatever the thread count. Value j of
// the row goes to lane j % 8 of an 8-lane f32 accumulator; lane l takes
// acc_l = fma(w_j, x_j, acc_l) for j = l, l + 8, l + 16, ... in increasing j;
// then y = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). The AVX2 and
// the portable paths follow this order and agree bit for bit.
//
// Accuracy: only f32 rounding of that sum (and of Q4_1's fma above), so
// |y - exact| <= about (k / 8 + 3) * 2^-24 * sum_j |x_j w_j| (standard
// recursive-summation bound); tests check 1e-5 * sum_j |x_j w_j| + 1e-6
// against a double-accumulating reference on the same weights.
void QuantMatmulTransBF32Act(const float* x, const uint8_t* w_quant, GgmlType w_type, int m,
                             int n, int k, float* y);

namespace internal {

// The ways QuantMatmulTransBF32Act can run; all give the same bits.
//   kPortable: plain C++ with std::fma.
//   kAvx2: AVX2 + FMA (the x86-64-v3 baseline the kernels are built for).
//   kAvx512: for m > 8 rows (prefill, batched decode), two weight rows per
//     AVX-512 register (kernels/cpu/quant_paired_sweep.inc); fewer rows as
//     kAvx2. Chosen at run time where the CPU and OS support AVX-512F.
//   kAvx2Paired: kAvx512's code on pairs of AVX2 registers, so that tests
//     check it on machines without AVX-512; never chosen for serving.
enum class QuantMatmulPath { kPortable, kAvx2, kAvx2Paired, kAvx512 };

// The path QuantMatmulTransBF32Act takes on this machine (detected once).
QuantMatmulPath QuantMatmulBestPath();
// True where `path` runs on this machine.
bool QuantMatmulPathSupported(QuantMatmulPath path);
// "portable", "avx2", "avx2-paired", "avx512".
const char* QuantMatmulPathName(QuantMatmulPath path);

// QuantMatmulTransBF32Act on `path`: same contract, same bits.
// REQUIRES: QuantMatmulPathSupported(path) (checked: aborts).
void QuantMatmulTransBF32ActOn(QuantMatmulPath path, const float* x, const uint8_t* w_quant,
                               GgmlType w_type, int m, int n, int k, float* y);

// QuantMatmulTransBF32ActOn(kPortable, ...), as a plain function pointer.
void QuantMatmulTransBF32ActPortable(const float* x, const uint8_t* w_quant, GgmlType w_type,
                                     int m, int n, int k, float* y);

}  // namespace internal
}  // namespace headway::cpu
