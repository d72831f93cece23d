#include "common/aligned_vector.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace headway {
namespace {

bool OnCacheLine(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(AlignedVectorTest, StorageStartsOnACacheLineAtEverySize) {
  for (size_t n : {1, 3, 16, 17, 1000, 100003}) {
    AlignedVector<float> v(n, 1.0f);
    EXPECT_TRUE(OnCacheLine(v.data())) << n;
    v.resize(2 * n + 5);  // a reallocation keeps the alignment
    EXPECT_TRUE(OnCacheLine(v.data())) << n;
    EXPECT_EQ(v[0], 1.0f);
  }
  AlignedVector<uint8_t> bytes(7);
  EXPECT_TRUE(OnCacheLine(bytes.data()));
}

}  // namespace
}  // namespace headway
