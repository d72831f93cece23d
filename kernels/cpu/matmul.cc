// Dense matrix products through OpenBLAS, one sgemm per chunk of output
// columns on the compute threads (kernels/threads.h explains why OpenBLAS
// itself runs single-threaded).
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstddef>

#include "kernels/threads.h"

namespace headway::cpu {
namespace {
// Column slices are multiples of this, so each slice starts on a cache-line
// boundary of y and w rows stay whole.
constexpr int kColumnAlign = 16;
// Below this many multiply-adds one thread is faster than waking helpers.
constexpr long kParallelMinWork = 1L << 18;
}  // namespace

void MatmulTransB(const float* x, const float* w, int m, int n, int k, float* y) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum; BLAS would reject lda = 0
    std::fill(y, y + size_t(m) * n, 0.0f);
    return;
  }
  // Row-major y[m, n] = x[m, k] * w[n, k]^T: w read transposed in place.
  // Always sgemm (never sgemv for one row): an element's summation order then
  // does not depend on m, so a row's result does not depend on its batch.
  const int64_t num_slices = (n + kColumnAlign - 1) / kColumnAlign;
  const bool parallel = long(m) * n * k >= kParallelMinWork;
  ParallelFor(num_slices, parallel ? 1 : num_slices, [&](int64_t begin, int64_t end) {
    const int n0 = int(begin) * kColumnAlign;
    const int n1 = std::min(n, int(end) * kColumnAlign);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n1 - n0, k, 1.0f, x, k,
                w + size_t(n0) * k, k, 0.0f, y + n0, n);
  });
}

}  // namespace headway::cpu
