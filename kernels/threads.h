// Compute threads of the CPU kernels.
#pragma once

namespace headway::cpu {

// Sets the OpenMP team size used by every CPU kernel to `num_threads` (>= 1)
// and makes OpenBLAS single-threaded: MatmulTransB splits its work over the
// same OpenMP team, so one thread pool serves every kernel. Two pools (GOMP's
// and OpenBLAS's own) spinning for the same cores measured 3 tokens/s
// instead of 17 on 2 cores. OpenMP keeps the team size per thread (the
// nthreads-var ICV): call this on the thread that runs the kernels, before
// the first one; a thread that never calls it gets one OpenMP thread per core.
//
// The team waits between kernels with libgomp's default policy (spin a
// while, then sleep). A decode step runs ~300 short parallel regions, so
// waking sleeping threads dominates: headway-worker-step-bench on an idle
// 2-core host measured 77.9 decode tokens/s with the default policy, 89.0
// with OMP_WAIT_POLICY=active and 21.4 with passive. On a host whose cores
// are oversubscribed by other work, OMP_WAIT_POLICY=passive avoids spinning.
void SetNumThreads(int num_threads);

}  // namespace headway::cpu
