// A linear layer's weight matrix and the kernel that applies it.
//
// Matrices stored quantised (Q4_1, Q8_0, ...) are applied with
// cpu::QuantMatmulTransB on the file's own blocks, whatever the number of
// rows, for two reasons:
//   * decode steps are bound by the bytes of weights read: 0.6 (Q4_1) or
//     1.06 (Q8_0) bytes per weight instead of 4 for f32
//     (headway-quant-matmul-bench: 4-8x faster than sgemm at 1 row);
//   * each row's arithmetic is the same whatever else is in the batch, so a
//     sequence's tokens do not depend on how it was batched or chunked. A
//     switch to sgemm above some row count would make prefill chunks and
//     whole prefills round differently and flip greedy near-ties.
// Activations are rounded to 8 bits per block of 32, as llama.cpp does for
// quantised matrices (error bound in kernels/quant_matmul.h). The f32 copy
// serves matrices without a quantised form and the exact-f32 reference path.
#pragma once

#include <cstdint>
#include <vector>

#include "common/gguf.h"

namespace headway {

struct LinearWeight {
  int rows = 0;                     // outputs
  int cols = 0;                     // inputs
  std::vector<float> f32;           // [rows, cols], dequantised
  // The stored blocks of the same matrix, row i at quant.data() + i * row
  // bytes; empty when the stored type is not one QuantMatmulTransB handles
  // or the shard's columns cut through a quantisation block.
  GgmlType quant_type = GgmlType::kF32;
  std::vector<uint8_t> quant;

  bool has_quant() const { return !quant.empty(); }
  // Bytes held (f32 and quantised copies).
  size_t num_bytes() const { return f32.size() * sizeof(float) + quant.size(); }
};

enum class MatmulPath {
  kQuantised,  // the stored blocks when present (serving)
  kF32,        // always the f32 copy: exact f32 arithmetic (reference checks)
};

// y = x * W^T:  x [m, w.cols] f32, y [m, w.rows] f32 (overwritten).
void ApplyLinear(const LinearWeight& w, const float* x, int m, float* y,
                 MatmulPath path = MatmulPath::kQuantised);

}  // namespace headway
