// Dense matrix products through OpenBLAS. OpenBLAS keeps its own thread pool;
// Headway does not change its threading.
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstddef>

namespace headway::cpu {

void MatmulTransB(const float* x, const float* w, int m, int n, int k, float* y) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum; BLAS would reject lda = 0
    std::fill(y, y + size_t(m) * n, 0.0f);
    return;
  }
  // Row-major y[m, n] = x[m, k] * w[n, k]^T: w read transposed in place.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
}

}  // namespace headway::cpu
