#include "worker/linear.h"

#include <algorithm>
#include <cstring>

#include "common/status.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/quant_matmul.h"
#include "kernels/threads.h"
#include "worker/dequant.h"

namespace headway {
namespace {

// Weights dequantised per tile of ApplyLinearDequantised: 1 MiB of f32, a
// multiple of 16 rows (MatmulTransB's column alignment) and at least 16.
constexpr size_t kTileFloats = size_t(1) << 18;
constexpr int kTileAlign = 16;

int TileRows(int cols) {
  const int rows = int(kTileFloats / size_t(std::max(cols, 1))) / kTileAlign * kTileAlign;
  return std::max(rows, kTileAlign);
}

}  // namespace

void LinearWeight::DequantizeRows(int row_begin, int row_end, float* out) const {
  HW_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows);
  const size_t count = size_t(row_end - row_begin) * size_t(cols);
  if (count == 0) return;
  if (!has_quant()) {
    std::memcpy(out, f32.data() + size_t(row_begin) * cols, count * sizeof(float));
    return;
  }
  // Cannot fail: Load kept these blocks only for a type Dequantize handles and
  // whole blocks per row.
  const Status s = Dequantize(quant_type, quant.data() + size_t(row_begin) * row_bytes(), out,
                              uint64_t(count));
  HW_CHECK(s.ok());
}

std::vector<float> LinearWeight::ToF32() const {
  std::vector<float> out(size_t(rows) * cols);
  DequantizeRows(0, rows, out.data());
  return out;
}

void ApplyLinear(const LinearWeight& w, const float* x, int m, float* y) {
  if (w.has_quant()) {
    cpu::QuantMatmulTransBF32Act(x, w.quant.data(), w.quant_type, m, w.rows, w.cols, y);
  } else {
    cpu::MatmulTransB(x, w.f32.data(), m, w.rows, w.cols, y);
  }
}

void ApplyLinearDequantised(const LinearWeight& w, const float* x, int m, float* y) {
  if (!w.has_quant() || m <= 0 || w.rows <= 0) {
    ApplyLinear(w, x, m, y);
    return;
  }
  const int tile = std::min(TileRows(w.cols), w.rows);
  std::vector<float> w_tile(size_t(tile) * w.cols);
  std::vector<float> y_tile(tile < w.rows ? size_t(m) * tile : 0);
  for (int r0 = 0; r0 < w.rows; r0 += tile) {
    const int r1 = std::min(w.rows, r0 + tile);
    const int n = r1 - r0;
    w.DequantizeRows(r0, r1, w_tile.data());
    if (n == w.rows) {  // one tile: y is its output
      cpu::MatmulTransB(x, w_tile.data(), m, n, w.cols, y);
      return;
    }
    cpu::MatmulTransB(x, w_tile.data(), m, n, w.cols, y_tile.data());
    for (int i = 0; i < m; ++i) {
      std::copy_n(y_tile.data() + size_t(i) * n, n, y + size_t(i) * w.rows + r0);
    }
  }
}

void EmbeddingLookup(const LinearWeight& table, int row_begin, const int32_t* ids, int n,
                     float* out) {
  const int row_end = row_begin + table.rows;
  if (!table.has_quant()) {
    cpu::EmbeddingShard(table.f32.data(), row_begin, row_end, ids, n, table.cols, out);
    return;
  }
  const int dim = table.cols;
  cpu::ParallelFor(n, std::max(1, (1 << 15) / std::max(dim, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = out + size_t(i) * dim;
      if (ids[i] >= row_begin && ids[i] < row_end) {
        table.DequantizeRows(ids[i] - row_begin, ids[i] - row_begin + 1, row);
      } else {
        std::memset(row, 0, sizeof(float) * dim);
      }
    }
  });
}

}  // namespace headway
