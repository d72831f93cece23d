// A linear layer's weight matrix and the kernel that applies it.
//
// Matrices stored quantised (Q4_1, Q8_0, ...) are applied on the file's own
// blocks with cpu::QuantMatmulTransBF32Act, whatever the number of rows:
//   * decode steps are bound by the bytes of weights read: 0.6 (Q4_1) or
//     1.06 (Q8_0) bytes per weight instead of 4 for f32
//     (headway-quant-matmul-bench: 3-6x faster than f32 sgemm at 1-4 rows);
//   * each output's summation order is fixed, so a row's result is the same
//     bits whatever else is in the batch and however many threads run: a
//     sequence's tokens do not depend on batching or prefill chunking;
//   * activations stay f32. Rounding them to 8 bits per block (llama.cpp's
//     method, MatmulPath::kQuantised8BitAct) moves SmolLM2's logits by up to
//     0.4 and flips near-ties, e.g. the first token of its answer to "What
//     is the capital of France?".
// The f32 copy serves matrices without a quantised form and the exact-f32
// reference path.
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
  kQuantisedF32Act,   // stored blocks, f32 activations (serving)
  kQuantised8BitAct,  // stored blocks, activations rounded to 8 bits (llama.cpp)
  kF32,               // always the f32 copy (reference checks)
};

// y = x * W^T:  x [m, w.cols] f32, y [m, w.rows] f32 (overwritten).
void ApplyLinear(const LinearWeight& w, const float* x, int m, float* y,
                 MatmulPath path = MatmulPath::kQuantisedF32Act);

}  // namespace headway
