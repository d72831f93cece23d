#include "worker/linear.h"

#include "kernels/matmul.h"
#include "kernels/quant_matmul.h"

namespace headway {

void ApplyLinear(const LinearWeight& w, const float* x, int m, float* y, MatmulPath path) {
  if (path == MatmulPath::kQuantisedF32Act && w.has_quant()) {
    cpu::QuantMatmulTransBF32Act(x, w.quant.data(), w.quant_type, m, w.rows, w.cols, y);
  } else if (path == MatmulPath::kQuantised8BitAct && w.has_quant()) {
    cpu::QuantMatmulTransB(x, w.quant.data(), w.quant_type, m, w.rows, w.cols, y);
  } else {
    cpu::MatmulTransB(x, w.f32.data(), m, w.rows, w.cols, y);
  }
}

}  // namespace headway
