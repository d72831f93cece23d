// cpu::ParallelFor and the per-thread pools behind it (kernels/threads.h):
// every index exactly once, for any thread count and chunk size; nesting
// runs inline; back-to-back jobs (the ticket protocol of
// kernels/cpu/thread_pool.h) lose and repeat nothing; pools of different
// threads are independent; more threads than cores still finish.
#include "kernels/threads.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace headway::cpu {
namespace {

// Counts how often each index of [0, n) was visited by one ParallelFor.
std::vector<int> Visits(int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  ParallelFor(n, min_chunk, [&](int64_t begin, int64_t end) {
    EXPECT_LE(0, begin);
    EXPECT_LT(begin, end);
    EXPECT_LE(end, n);
    for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
  });
  std::vector<int> out;
  for (const std::atomic<int>& h : hits) out.push_back(h.load());
  return out;
}

TEST(ThreadPoolTest, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    SetNumThreads(threads);
    EXPECT_EQ(NumThreads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 100003}) {
      for (int64_t min_chunk : {1, 2, 5, 1000}) {
        SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                     " min_chunk=" + std::to_string(min_chunk));
        const std::vector<int> hits = Visits(n, min_chunk);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "index " << i;
      }
    }
  }
  SetNumThreads(2);
}

TEST(ThreadPoolTest, SmallLoopsRunAsOneRangeOnTheCaller) {
  SetNumThreads(4);
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  ParallelFor(9, 5, [&](int64_t begin, int64_t end) {  // 9 < 2 * 5
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 9);
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPoolTest, NestedLoopsRunInline) {
  SetNumThreads(4);
  std::atomic<int64_t> total{0};
  ParallelFor(64, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const std::thread::id outer = std::this_thread::get_id();
      ParallelFor(100, 1, [&](int64_t b, int64_t e) {
        EXPECT_EQ(std::this_thread::get_id(), outer);  // no nesting across threads
        total.fetch_add(e - b);
      });
    }
  });
  EXPECT_EQ(total.load(), 64 * 100);
}

TEST(ThreadPoolTest, BackToBackJobsLoseNothing) {
  // Tiny jobs, one after another: helpers join and leave jobs that end while
  // they wake, the case the ticket protocol guards.
  for (int threads : {2, 4}) {
    SetNumThreads(threads);
    std::vector<int64_t> sums(20000, 0);
    for (size_t job = 0; job < sums.size(); ++job) {
      std::atomic<int64_t> sum{0};
      const int64_t n = 2 + int64_t(job % 13);
      ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sum.fetch_add(i + 1);
      });
      sums[job] = sum.load();
      ASSERT_EQ(sums[job], n * (n + 1) / 2) << "job " << job;
    }
  }
  SetNumThreads(2);
}

TEST(ThreadPoolTest, PoolsOfDifferentThreadsAreIndependent) {
  // Two callers, each with a pool of its own, running at the same time on
  // more threads than this machine has cores.
  auto run = [](int threads, std::atomic<int64_t>* total) {
    SetNumThreads(threads);
    for (int job = 0; job < 2000; ++job) {
      ParallelFor(50, 1, [&](int64_t begin, int64_t end) { total->fetch_add(end - begin); });
    }
  };
  std::atomic<int64_t> a{0}, b{0};
  std::thread ta(run, 3, &a), tb(run, 4, &b);
  ta.join();
  tb.join();
  EXPECT_EQ(a.load(), 2000 * 50);
  EXPECT_EQ(b.load(), 2000 * 50);
}

TEST(ThreadPoolTest, ReplacingThePoolJoinsTheOldHelpers) {
  for (int i = 0; i < 50; ++i) {
    SetNumThreads(1 + i % 4);
    EXPECT_EQ(Visits(100, 1), std::vector<int>(100, 1));
  }
  SetNumThreads(2);
}

}  // namespace
}  // namespace headway::cpu
