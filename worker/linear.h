// A linear layer's weight matrix and the kernels that apply it.
//
// A matrix is held once, in one form: the file's own quantised blocks where
// cpu::QuantMatmulTransBF32Act reads the type and the shard's columns do not
// cut a block (every matrix of SmolLM2 and Gemma 3 at their valid TP sizes),
// else dequantised f32. No f32 copy of a quantised matrix is kept: it would
// quadruple the weights' memory (SmolLM2-135M Q4_1: about 540 MB more).
//
// Serving applies quantised matrices with cpu::QuantMatmulTransBF32Act,
// whatever the number of rows:
//   * decode steps are bound by the bytes of weights read: 0.6 (Q4_1) or
//     1.06 (Q8_0) bytes per weight instead of 4 for f32
//     (headway-quant-matmul-bench: 3-6x faster than f32 sgemm at 1-4 rows);
//   * each output's summation order is fixed, so a row's result is the same
//     bits whatever else is in the batch and however many threads run: a
//     sequence's tokens do not depend on batching or prefill chunking;
//   * activations stay f32. Rounding them to 8 bits per block (llama.cpp's
//     method, kernels/reference/quant_matmul_8bit_act.h) moves SmolLM2's
//     logits by up to 0.4 and flips near-ties, e.g. the first token of its
//     answer to "What is the capital of France?".
#pragma once

#include <cstdint>
#include <vector>

#include "common/gguf.h"

namespace headway {

struct LinearWeight {
  int rows = 0;  // outputs
  int cols = 0;  // inputs
  // The stored blocks, row i at quant.data() + i * row_bytes(); empty when
  // the matrix is held as f32 instead.
  GgmlType quant_type = GgmlType::kF32;
  std::vector<uint8_t> quant;
  // [rows, cols] dequantised; empty when the matrix is held quantised.
  std::vector<float> f32;

  bool has_quant() const { return !quant.empty(); }
  // Bytes of one row of `quant` (0 when held as f32).
  size_t row_bytes() const { return rows > 0 ? quant.size() / size_t(rows) : 0; }
  // Bytes held.
  size_t num_bytes() const { return f32.size() * sizeof(float) + quant.size(); }

  // Rows [row_begin, row_end) as f32 into out ([row_end - row_begin, cols]),
  // the values worker/dequant.h gives for the stored blocks (zero-byte
  // padding rows give zeros). Thread-safe (reads only).
  // REQUIRES: 0 <= row_begin <= row_end <= rows.
  void DequantizeRows(int row_begin, int row_end, float* out) const;
  // The whole matrix as f32, [rows, cols]: a copy, for uploads and tests.
  std::vector<float> ToF32() const;
};

// y = x * W^T:  x [m, w.cols] f32, y [m, w.rows] f32 (overwritten), host.
// The serving path: the stored blocks by QuantMatmulTransBF32Act, or the f32
// matrix by cpu::MatmulTransB (OpenBLAS).
void ApplyLinear(const LinearWeight& w, const float* x, int m, float* y);

// y = x * W^T as ApplyLinear, but always in f32 on the dequantised weights:
// tiles of rows are dequantised into a scratch (about 1 MiB per call) and
// multiplied by cpu::MatmulTransB. The exact-f32 reference path for tests;
// about as fast as sgemm on an f32 copy for prefill-sized m.
void ApplyLinearDequantised(const LinearWeight& w, const float* x, int m, float* y);

// One of the two above, or a test's own (DecoderModel::TEST_set_linear).
using LinearFn = void (*)(const LinearWeight& w, const float* x, int m, float* y);

// Vocab-parallel embedding lookup (kernels/elementwise.h EmbeddingShard) from
// a table in either form: out[i, :] = table row ids[i] - row_begin when
// row_begin <= ids[i] < row_begin + table.rows, else zeros. Only the rows
// looked up are dequantised.
//   ids: [n], each >= 0; out: [n, table.cols] f32, host.
void EmbeddingLookup(const LinearWeight& table, int row_begin, const int32_t* ids, int n,
                     float* out);

}  // namespace headway
