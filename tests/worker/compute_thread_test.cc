#include "worker/compute_thread.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "kernels/threads.h"

namespace headway {
namespace {

TEST(ComputeThreadTest, CallRunsOnTheComputeThreadAndReturnsTheResult) {
  ComputeThread compute(2);
  const std::thread::id caller = std::this_thread::get_id();
  const std::thread::id ran_on = compute.Call([] { return std::this_thread::get_id(); });
  EXPECT_NE(ran_on, caller);
  // Every call runs on the same thread.
  EXPECT_EQ(compute.Call([] { return std::this_thread::get_id(); }), ran_on);
  std::string s = compute.Call([] { return std::string("moved out"); });
  EXPECT_EQ(s, "moved out");
  int calls = 0;
  compute.Call([&] { ++calls; });
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(compute.busy());
}

TEST(ComputeThreadTest, ThePoolIsTheComputeThreads) {
  ComputeThread compute(3);
  // The pool is per thread: the compute thread's has 3 threads.
  EXPECT_EQ(compute.Call([] { return cpu::NumThreads(); }), 3);
}

TEST(ComputeThreadTest, StartThenWaitSeesWhatTheTaskWrote) {
  ComputeThread compute(1);
  EXPECT_FALSE(compute.Wait(std::chrono::milliseconds(0)));  // nothing started
  std::atomic<bool> release{false};
  int result = 0;
  compute.Start([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    result = 42;
  });
  EXPECT_TRUE(compute.busy());
  EXPECT_FALSE(compute.Wait(std::chrono::milliseconds(5)));  // still running
  EXPECT_TRUE(compute.busy());
  release = true;
  EXPECT_TRUE(compute.Wait(std::nullopt));
  EXPECT_EQ(result, 42);
  EXPECT_FALSE(compute.busy());
  EXPECT_FALSE(compute.Wait(std::chrono::milliseconds(0)));  // collected once
}

TEST(ComputeThreadTest, DestructorWaitsForTheRunningTask) {
  std::atomic<bool> finished{false};
  {
    ComputeThread compute(1);
    compute.Start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      finished = true;
    });
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace headway
