#include "kernels/cpu/thread_pool.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "common/status.h"

namespace headway::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// How long an idle helper spins before it sleeps: longer than the gap
// between two loops of a step, short enough not to burn a core for long
// after the last one.
constexpr std::chrono::microseconds kSpin(200);
// Chunks per thread: enough that a slow or late thread leaves few behind,
// few enough that claiming costs nothing.
constexpr int64_t kChunksPerThread = 4;
constexpr uint64_t kJoinedMask = (uint64_t{1} << 16) - 1;
constexpr uint64_t kOneTicket = uint64_t{1} << 16;
// Waits the owner spends in _mm_pause before it yields its core, so that a
// helper preempted in the middle of a chunk gets to run and finish it.
constexpr int kPausesBeforeYield = 2000;

void Backoff(int attempt) {
  if (attempt < kPausesBeforeYield) {
    _mm_pause();
  } else {
    std::this_thread::yield();
  }
}

uint64_t Ticket(uint64_t state) { return state >> 16; }

// The calling thread's pool and whether it is inside a ParallelFor body.
thread_local std::unique_ptr<ThreadPool> t_pool;
thread_local bool t_in_body = false;

ThreadPool& PoolOfThisThread() {
  if (t_pool == nullptr) {
    t_pool = std::make_unique<ThreadPool>(
        std::max(1, int(std::thread::hardware_concurrency())));
  }
  return *t_pool;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  HW_CHECK(num_threads >= 1 && uint64_t(num_threads) < kJoinedMask);
  helpers_.reserve(size_t(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

ThreadPool::~ThreadPool() {
  quit_.store(true);
  wake_.fetch_add(1);
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

bool ThreadPool::JoinJob(uint64_t ticket) {
  uint64_t state = state_.load(std::memory_order_acquire);
  while (Ticket(state) == ticket) {
    if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) return true;
  }
  return false;  // the job is over (or being replaced)
}

void ThreadPool::RunChunks(const Job& job) {
  t_in_body = true;
  while (true) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.num_chunks) break;
    const int64_t begin = c * job.chunk;
    (*job.body)(begin, std::min(job.n, begin + job.chunk));
    chunks_done_.fetch_add(1, std::memory_order_release);
  }
  t_in_body = false;
}

void ThreadPool::HelperLoop() {
  uint64_t last_ticket = 0;
  while (!quit_.load(std::memory_order_relaxed)) {
    // Wait for an open ticket this helper has not served yet.
    const Clock::time_point spin_end = Clock::now() + kSpin;
    uint64_t ticket = Ticket(state_.load(std::memory_order_acquire));
    for (int i = 0; ticket == last_ticket || ticket % 2 != 0; ++i) {
      if (quit_.load(std::memory_order_relaxed)) return;
      if ((i & 63) == 63 && Clock::now() > spin_end) {
        const uint32_t seen = wake_.load(std::memory_order_acquire);
        // The destructor sets quit_ before it bumps wake_: a `seen` taken
        // after that bump would wait for a wake that never comes.
        if (quit_.load(std::memory_order_acquire)) return;
        ticket = Ticket(state_.load(std::memory_order_acquire));
        if (ticket != last_ticket && ticket % 2 == 0) break;
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        // The owner bumps wake_ after opening a ticket, then wakes sleepers:
        // a bump between the load of `seen` and the wait ends it at once.
        if (Ticket(state_.load(std::memory_order_seq_cst)) == ticket) wake_.wait(seen);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      } else {
        _mm_pause();
      }
      ticket = Ticket(state_.load(std::memory_order_acquire));
    }
    last_ticket = ticket;
    if (!JoinJob(ticket)) continue;
    const Job job = job_;  // stable while joined
    RunChunks(job);
    state_.fetch_sub(1, std::memory_order_release);  // leave
  }
}

void ThreadPool::Run(int64_t n, int64_t chunk, ChunkFn body) {
  // Close the ticket once no helper is joined to the last job (a helper
  // leaves right after its last chunk), then write the new job.
  uint64_t open = state_.load(std::memory_order_acquire) & ~kJoinedMask;
  for (int i = 0;; ++i) {
    uint64_t expected = open;  // no helper joined
    if (state_.compare_exchange_weak(expected, open + kOneTicket, std::memory_order_acq_rel)) {
      break;
    }
    open = expected & ~kJoinedMask;
    Backoff(i);
  }
  const uint64_t closed = open + kOneTicket;
  job_.body = &body;
  job_.n = n;
  job_.chunk = chunk;
  job_.num_chunks = (n + chunk - 1) / chunk;
  next_chunk_.store(0, std::memory_order_relaxed);
  chunks_done_.store(0, std::memory_order_relaxed);
  state_.store(closed + kOneTicket, std::memory_order_seq_cst);  // open: an even ticket
  wake_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_.notify_all();

  RunChunks(job_);
  // Wait for the chunks helpers claimed; the owner has run all the others.
  for (int i = 0; chunks_done_.load(std::memory_order_acquire) < job_.num_chunks; ++i) {
    Backoff(i);
  }
}

void SetNumThreads(int num_threads) {
  t_pool = std::make_unique<ThreadPool>(std::max(1, num_threads));
  openblas_set_num_threads(1);
}

int NumThreads() { return PoolOfThisThread().num_threads(); }

void ParallelFor(int64_t n, int64_t min_chunk, ChunkFn body) {
  HW_CHECK(n >= 0 && min_chunk >= 1);
  if (n == 0) return;
  if (t_in_body || n < 2 * min_chunk) {
    body(0, n);
    return;
  }
  ThreadPool& pool = PoolOfThisThread();
  if (pool.num_threads() == 1) {
    body(0, n);
    return;
  }
  const int64_t per_thread = (n + pool.num_threads() * kChunksPerThread - 1) /
                             (pool.num_threads() * kChunksPerThread);
  pool.Run(n, std::max(min_chunk, per_thread), body);
}

}  // namespace headway::cpu
