// The pool behind cpu::ParallelFor (kernels/threads.h). Internal to
// kernels/cpu.
//
// One job at a time, posted by the pool's owner thread. The job is a count
// of chunks; the owner and the helpers claim chunk indices from one atomic
// counter until none is left, and the owner returns once every claimed
// chunk has finished. A helper takes part in a job only after joining it
// (JoinJob), and the owner reuses the job's fields only once no helper is
// joined, so a helper that wakes late never sees a half-written job.
//
//   state_: bits 63..16 ticket, bits 15..0 helpers joined to the job.
//   The ticket is even while a job is open to helpers and odd while the
//   owner rewrites the job (no helper may join then).
//
// Idle helpers spin for about kSpin between jobs, since a step's loops come
// tens of microseconds apart, then sleep on the ticket word.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/threads.h"

namespace headway::cpu {

class ThreadPool {
 public:
  // num_threads >= 1 in all: the owner (the constructing thread, which runs
  // Run) and num_threads - 1 helpers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();  // stops and joins the helpers

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(helpers_.size()) + 1; }

  // Runs body(c * chunk, min(n, (c + 1) * chunk)) for every chunk c of
  // [0, n), on the owner and the helpers. REQUIRES: called by the owner,
  // not from inside a body.
  void Run(int64_t n, int64_t chunk, ChunkFn body);

 private:
  struct Job {
    const ChunkFn* body = nullptr;
    int64_t n = 0;
    int64_t chunk = 0;
    int64_t num_chunks = 0;
  };

  void HelperLoop();
  // Runs chunks of the current job until none is left.
  void RunChunks(const Job& job);
  // Joins the job of ticket `ticket` if it is still open; false otherwise.
  bool JoinJob(uint64_t ticket);

  Job job_;                                // written by the owner while the ticket is odd
  std::atomic<uint64_t> state_{0};         // ticket << 16 | helpers joined
  std::atomic<uint32_t> wake_{0};          // bumped per job; sleeping helpers wait on it
  std::atomic<int64_t> next_chunk_{0};     // the next chunk to claim
  std::atomic<int64_t> chunks_done_{0};    // chunks finished
  std::atomic<int> sleepers_{0};           // helpers asleep on wake_
  std::atomic<bool> quit_{false};
  std::vector<std::thread> helpers_;
};

}  // namespace headway::cpu
