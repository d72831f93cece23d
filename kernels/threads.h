// Compute threads of the CPU kernels.
#pragma once

namespace headway::cpu {

// Sets the OpenMP team size used by every CPU kernel to `num_threads` (>= 1)
// and makes OpenBLAS single-threaded: MatmulTransB splits its work over the
// same OpenMP team, so one thread pool serves every kernel. Two pools (GOMP's
// and OpenBLAS's own) spinning for the same cores measured 3 tokens/s
// instead of 17 on 2 cores. Call once from main, before any kernel runs.
void SetNumThreads(int num_threads);

}  // namespace headway::cpu
