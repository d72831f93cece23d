// The KV pool in every KV cache dtype: block sizes from common/kv_layout.h,
// how many sequences one kv_memory_mb holds, and layouts refused.
#include "worker/kv_pool.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace headway {
namespace {

constexpr KvCacheDtype kDtypes[] = {KvCacheDtype::kFloat32, KvCacheDtype::kFloat16,
                                    KvCacheDtype::kQ8_0, KvCacheDtype::kQ4_0,
                                    KvCacheDtype::kQ4_0Hadamard};

TEST(KvPoolDtypeTest, BlockBytesOfEachDtype) {
  // SmolLM2's head_dim 64, 16 positions, K and V.
  EXPECT_EQ((KvCacheLayout{16, 64, KvCacheDtype::kFloat32}.BlockBytes()), 8192u);
  EXPECT_EQ((KvCacheLayout{16, 64, KvCacheDtype::kFloat16}.BlockBytes()), 4096u);
  EXPECT_EQ((KvCacheLayout{16, 64, KvCacheDtype::kQ8_0}.BlockBytes()), 2u * 16 * 2 * 34);
  EXPECT_EQ((KvCacheLayout{16, 64, KvCacheDtype::kQ4_0}.BlockBytes()), 2u * 16 * 2 * 18);
  // V starts after block_size K rows.
  const KvCacheLayout q8{16, 256, KvCacheDtype::kQ8_0};
  EXPECT_EQ(q8.RowBytes(), 8u * 34);
  EXPECT_EQ(q8.VOffset(0), 16 * q8.RowBytes());
  EXPECT_EQ(q8.KOffset(3), 3 * q8.RowBytes());
}

// Sequences of 1,024 tokens that pools of the same kv_memory_mb hold, for
// SmolLM2 (30 layers x 3 KV heads, head_dim 64) and Gemma 3 270M (18 x 1,
// head_dim 256, no recycling counted), scales included.
TEST(KvPoolDtypeTest, SequencesHeldAtTheSameMemory) {
  struct Model {
    const char* name;
    int slots;
    int head_dim;
  };
  const int64_t kv_memory = int64_t(512) << 20;
  const int blocks_per_slot = 1024 / 16;
  for (const Model& m : {Model{"SmolLM2-135M", 90, 64}, Model{"Gemma-3-270M", 18, 256}}) {
    int64_t f32_seqs = 0;
    for (KvCacheDtype dtype : kDtypes) {
      Result<std::unique_ptr<KvPool>> pool = KvPool::Create({16, m.head_dim, dtype}, kv_memory);
      ASSERT_TRUE(pool.ok()) << pool.status().ToString();
      const int64_t seqs = (*pool)->num_blocks() / (int64_t(m.slots) * blocks_per_slot);
      if (dtype == KvCacheDtype::kFloat32) f32_seqs = seqs;
      const double ratio = double(seqs) / double(f32_seqs);
      std::printf("[ measured ] %s %s: %d blocks of %zu bytes in 512 MiB, %lld sequences of 1024 "
                  "tokens, %.2fx float32\n",
                  m.name, KvCacheDtypeName(dtype), (*pool)->num_blocks(),
                  (*pool)->layout().BlockBytes(), static_cast<long long>(seqs), ratio);
      const double goal = dtype == KvCacheDtype::kFloat16 ? 1.95
                          : dtype == KvCacheDtype::kQ8_0  ? 3.5
                          : dtype == KvCacheDtype::kFloat32 ? 1.0
                                                            : 6.0;
      EXPECT_GE(ratio, goal) << m.name << " " << KvCacheDtypeName(dtype);
    }
  }
}

TEST(KvPoolDtypeTest, RefusesHeadDimsTheDtypeCannotGroup) {
  Result<std::unique_ptr<KvPool>> pool = KvPool::Create({16, 48, KvCacheDtype::kQ8_0}, 1 << 20);
  ASSERT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("head_dim 48 is not a multiple of 32"), std::string::npos)
      << pool.status().message();
  EXPECT_TRUE(KvPool::Create({16, 48, KvCacheDtype::kFloat16}, 1 << 20).ok());
}

}  // namespace
}  // namespace headway
