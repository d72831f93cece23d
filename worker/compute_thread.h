// The one thread of a worker that runs its kernels, from loading the model
// to the last step.
//
// Why one: the kernels' compute threads are a pool per calling thread
// (kernels/threads.h), as OpenMP's teams were per master thread. A worker
// whose main thread ran kernels while loading and whose step thread ran them
// while serving had two teams, 4 threads on a 2-core host, and libgomp then
// cut its spin-wait between loops short (it throttles once it manages more
// threads than there are CPUs): a decode step paid a futex sleep and wake-up
// at each of its ~300 loops. With every kernel on this thread there is one
// pool of num_threads threads, as in-process (headway-worker-step-bench).
//
// The CUDA backend keeps its device current per thread, so a model created
// here also runs its steps here on the device it set.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace headway {

class ComputeThread {
 public:
  // Starts the thread. `num_threads` > 0 gives it a pool of that many
  // compute threads (cpu::SetNumThreads, which also makes OpenBLAS
  // single-threaded); 0 leaves the default of one per core.
  explicit ComputeThread(int num_threads);
  // Waits for the task in progress, if any, then stops the thread.
  ~ComputeThread();

  ComputeThread(const ComputeThread&) = delete;
  ComputeThread& operator=(const ComputeThread&) = delete;

  // Runs fn() on the compute thread and returns what it returns; the caller
  // blocks until then. REQUIRES: !busy().
  template <class F>
  std::invoke_result_t<F> Call(F&& fn) {
    using R = std::invoke_result_t<F>;
    if constexpr (std::is_void_v<R>) {
      Start([&fn] { fn(); });
      Wait(std::nullopt);
    } else {
      std::optional<R> out;
      Start([&fn, &out] { out.emplace(fn()); });
      Wait(std::nullopt);
      return std::move(*out);
    }
  }

  // Starts task() on the compute thread and returns at once.
  // REQUIRES: !busy().
  void Start(std::function<void()> task);

  // True from Start until a Wait that returned true.
  bool busy() const;

  // Waits up to `timeout` (nullopt: for as long as it takes) for the started
  // task. True once it has finished: what it wrote is then visible to the
  // caller and the thread is free for the next Start. False if it is still
  // running or none was started.
  bool Wait(std::optional<std::chrono::milliseconds> timeout);

 private:
  void Run(int num_threads);

  mutable std::mutex mu_;
  std::condition_variable task_cv_;  // a task or quit, for the compute thread
  std::condition_variable done_cv_;  // a finished task, for the caller
  std::function<void()> task_;       // guarded by mu_; set from Start until it runs
  bool started_ = false;             // guarded by mu_; from Start to a successful Wait
  bool done_ = false;                // guarded by mu_; the started task has finished
  bool quit_ = false;                // guarded by mu_
  std::thread thread_;               // last: starts after the fields above exist
};

}  // namespace headway
