// Dense matrix products (CPU, f32, OpenBLAS).
#pragma once

namespace headway::cpu {

// y = x * w^T, the layout of a linear layer whose weight rows are outputs
// (GGUF stores a [n_out, n_in] matrix as ne = {n_in, n_out}).
//   x: [m, k] f32 row-major; w: [n, k] f32 row-major; y: [m, n] f32
void MatmulTransB(const float* x, const float* w, int m, int n, int k, float* y);

}  // namespace headway::cpu
