// Compute threads of the CPU kernels: a pool per calling thread, and the
// loop every parallel kernel runs through.
//
// Why not OpenMP: a decode step runs ~300 short parallel loops, and an
// OpenMP loop ends at a barrier that waits for every thread of the team to
// arrive. When another process or thread takes one of the cores (the
// coordinator, HTTP threads, a second deployment, a test running beside
// this one) the barrier waits for the preempted thread's next time slice,
// milliseconds, at every loop: two deployments on one 2-core host took a
// SmolLM2 decode step from 16 ms to 2.9 s. ParallelFor hands out chunks
// through an atomic counter and the calling thread runs every chunk no
// helper has claimed, so it waits only for chunks a helper has started,
// never for a helper that is not running.
//
// Every kernel splits its work so that what an output gets computed from,
// and in which order, does not depend on how chunks land on threads: results
// are the same bits for any thread count.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace headway::cpu {

// Gives the calling thread a pool of `num_threads` compute threads in all
// (the caller and num_threads - 1 helpers; clamped to >= 1), replacing the
// one it had. Kernels called from this thread use it. A thread that never
// calls it gets one thread per core on its first parallel loop.
// Also makes OpenBLAS single-threaded: MatmulTransB splits its work over the
// pool, and a second pool spinning for the same cores measured 3 tokens/s
// instead of 17 on 2 cores.
void SetNumThreads(int num_threads);

// Threads of the calling thread's pool (its default if it has none yet).
int NumThreads();

// A non-owning reference to a callable taking (begin, end): what
// ParallelFor calls, without std::function's allocation.
class ChunkFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ChunkFn>>>
  ChunkFn(F&& f)  // NOLINT: implicit, like a function_ref
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int64_t begin, int64_t end) {
          (*static_cast<std::remove_reference_t<F>*>(o))(begin, end);
        }) {}

  void operator()(int64_t begin, int64_t end) const { call_(object_, begin, end); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int64_t);
};

// Calls body(begin, end) for consecutive ranges that together cover
// [0, n) once each, in parallel on the calling thread's pool, and returns
// when all have run. Ranges hold at least `min_chunk` items (the last may
// hold fewer), about 4 per thread; how [0, n) is cut and which thread runs
// which range are not fixed, so a body's results must not depend on them.
// Runs everything on the calling thread, as one range, when the pool has
// one thread, when n < 2 * min_chunk, or when called from inside another
// ParallelFor (no nesting).
// `body` must not throw. REQUIRES: n >= 0, min_chunk >= 1.
void ParallelFor(int64_t n, int64_t min_chunk, ChunkFn body);

}  // namespace headway::cpu
