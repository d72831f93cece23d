// CTA-wide reductions shared by the kernels of kernels/cuda (device code,
// private to this folder).
#pragma once

namespace headway::cuda {

// Sum of `v` over a CTA of kWarps full warps; every thread gets the total,
// added in the same (warp) order in every thread. `scratch`: [kWarps] shared
// floats; safe to call again right after it returns.
template <int kWarps>
__device__ float BlockSum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused by the caller
  return total;
}

}  // namespace headway::cuda
