// What every GPU test shares: skipping cleanly where no CUDA device exists,
// and random data for kernel checks against the CPU references.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace headway::testing {

// Skips the calling test with the runtime's reason when this machine has no
// CUDA device (CI), so a GPU test never fails for want of a GPU; on a GPU
// machine it makes device 0 current.
#define HW_SKIP_WITHOUT_GPU()                                                    \
  do {                                                                           \
    if (::headway::cuda::DeviceCount() == 0) {                                   \
      GTEST_SKIP() << "GPU test skipped: " << ::headway::cuda::NoDeviceReason(); \
    }                                                                            \
    ASSERT_TRUE(::headway::cuda::SetDevice(0).ok());                             \
  } while (0)

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Records `error` as the running test's property `key` (the largest value
// recorded under it so far), so the GPU check's JSON (tests/gpu/run.sh)
// carries each kernel's max error against its reference; returns `error`
// for the EXPECT around it.
inline double RecordError(double error, const char* key = "max_abs_error") {
  static std::map<std::string, double> largest;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string id = std::string(info ? info->test_suite_name() : "") + "." +
                         (info ? info->name() : "") + "/" + key;
  auto [it, inserted] = largest.emplace(id, error);
  if (!inserted) it->second = std::max(it->second, error);
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", it->second);
  ::testing::Test::RecordProperty(key, text);
  return error;
}

// Largest |got - want|, in double; NaN in both at one index counts as equal,
// NaN in one only as infinitely far.
inline double MaxAbsDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

// Waits for the default stream; fails the test with the runtime's error.
inline void Sync(const char* what) {
  const Status s = cuda::Synchronize(nullptr, what);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// A device copy of `host`, synchronously (tests only).
template <typename T>
cuda::DeviceBuffer ToDevice(const std::vector<T>& host) {
  auto buffer = cuda::DeviceBuffer::Allocate(host.size() * sizeof(T));
  EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
  if (!buffer.ok()) return {};
  EXPECT_TRUE(
      cuda::CopyToDevice(buffer->data(), host.data(), host.size() * sizeof(T), nullptr).ok());
  EXPECT_TRUE(cuda::Synchronize(nullptr, "ToDevice").ok());
  return std::move(*buffer);
}

// `n` values of T copied back from device memory, synchronously.
template <typename T>
std::vector<T> ToHost(const void* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_TRUE(cuda::CopyToHost(host.data(), device, n * sizeof(T), nullptr).ok());
  EXPECT_TRUE(cuda::Synchronize(nullptr, "ToHost").ok());
  return host;
}

}  // namespace headway::testing
