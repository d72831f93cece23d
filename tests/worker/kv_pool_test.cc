// The KV pool in every KV cache dtype: block sizes from common/kv_layout.h,
// how many sequences one kv_memory_mb holds, and layouts refused; arenas of
// two block sizes (common/kv_arena.h): their sizes and where a block lies.
#include "worker/kv_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/kv_arena.h"
#include "kernels/attention.h"

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

// Gemma 3 270M's slots: 18 layers of one KV head, every sixth full.
std::vector<SlotSpec> Gemma3Slots() {
  std::vector<SlotSpec> specs;
  for (int l = 0; l < 18; ++l) specs.push_back(SlotSpec{l % 6 == 5 ? 0 : 512, 0});
  return specs;
}

// float32 full slots and q8_0 sliding ones at head_dim 256: blocks of 32,768
// and 8,704 bytes in chunks of their least common multiple, 557,056 bytes
// (17 float32 or 64 q8_0 blocks).
TEST(KvPoolArenaTest, MixedArenaSizes) {
  const KvArenaLayout arena = MakeKvArenaLayout(
      16, 256, KvCacheDtypes{KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0}, Gemma3Slots());
  ASSERT_TRUE(arena.mixed());
  EXPECT_EQ(arena.chunk_bytes, 557056u);
  const int64_t kv_memory = int64_t(64) << 20;
  Result<std::unique_ptr<KvPool>> created = KvPool::CreateArena(arena, kv_memory);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const KvPool& pool = **created;
  EXPECT_EQ(pool.num_chunks(), int(kv_memory / 557056));
  EXPECT_EQ(pool.num_blocks(KvCacheDtype::kFloat32), pool.num_chunks() * 17);
  EXPECT_EQ(pool.num_blocks(KvCacheDtype::kQ8_0), pool.num_chunks() * 64);
  EXPECT_EQ(pool.num_blocks(KvCacheDtype::kQ4_0), 0) << "no slot of this arena is q4_0";
  // layout() and num_blocks() are the full slots' class.
  EXPECT_EQ(pool.layout().dtype, KvCacheDtype::kFloat32);
  EXPECT_EQ(pool.layout().BlockBytes(), 32768u);
  EXPECT_EQ(pool.num_blocks(), pool.num_blocks(KvCacheDtype::kFloat32));
  EXPECT_EQ(pool.num_bytes(), size_t(pool.num_chunks()) * 557056);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.data()) % KvPool::kAlignmentBytes, 0u);
  std::printf("[ measured ] Gemma-3-270M float32 + q8_0 sliding, 64 MiB: %d chunks of %zu "
              "bytes, %d float32 or %d q8_0 blocks\n",
              pool.num_chunks(), arena.chunk_bytes, pool.num_blocks(KvCacheDtype::kFloat32),
              pool.num_blocks(KvCacheDtype::kQ8_0));

  Result<std::unique_ptr<KvPool>> small = KvPool::CreateArena(arena, 557055);
  ASSERT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  for (const char* part : {"557055 bytes", "chunk of 557056 bytes", "17 float32 blocks of 32768",
                           "64 q8_0 blocks of 8704", "cache.kv_memory_mb"}) {
    EXPECT_NE(small.status().message().find(part), std::string::npos)
        << "no '" << part << "' in " << small.status().message();
  }
}

// With one dtype the arena is today's pool: a chunk is a block.
TEST(KvPoolArenaTest, OneDtypeArenaIsAnArrayOfBlocks) {
  for (KvCacheDtype dtype : kDtypes) {
    // The same dtype for both kinds of slot, or a model with no sliding
    // slot: one class either way.
    for (const KvArenaLayout& arena :
         {MakeKvArenaLayout(16, 64, KvCacheDtypes{dtype, dtype}, Gemma3Slots()),
          MakeKvArenaLayout(16, 64, KvCacheDtypes{dtype, KvCacheDtype::kQ4_0},
                            std::vector<SlotSpec>(6, SlotSpec{}))}) {
      ASSERT_FALSE(arena.mixed());
      Result<std::unique_ptr<KvPool>> from_arena = KvPool::CreateArena(arena, 1 << 20);
      Result<std::unique_ptr<KvPool>> from_layout = KvPool::Create({16, 64, dtype}, 1 << 20);
      ASSERT_TRUE(from_arena.ok() && from_layout.ok());
      EXPECT_EQ((*from_arena)->arena().chunk_bytes, (*from_layout)->layout().BlockBytes());
      EXPECT_EQ((*from_arena)->num_chunks(), (*from_layout)->num_blocks());
      EXPECT_EQ((*from_arena)->num_blocks(), (*from_layout)->num_blocks());
      EXPECT_EQ((*from_arena)->num_blocks(dtype), (*from_layout)->num_blocks());
      EXPECT_EQ((*from_layout)->num_chunks(), (*from_layout)->num_blocks());
      EXPECT_EQ((*from_arena)->num_bytes(), (*from_layout)->num_bytes());
    }
  }
  Result<std::unique_ptr<KvPool>> none = KvPool::Create({16, 64}, 8191);
  ASSERT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("hold no block of 8192 bytes"), std::string::npos)
      << none.status().message();
}

// Block b of dtype d lies at b * BlockBytes(d): the ids a chunk holds for
// either dtype address only that chunk's bytes. Written through the CPU
// kernel that stores K and V (the decoder's path), so a wrong stride or
// base shows as bytes changed outside the chunk.
TEST(KvPoolArenaTest, BlocksOfEitherDtypeStayInsideTheirChunk) {
  const KvArenaLayout arena = MakeKvArenaLayout(
      16, 256, KvCacheDtypes{KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0}, Gemma3Slots());
  Result<std::unique_ptr<KvPool>> created = KvPool::CreateArena(arena, int64_t(4) * 557056);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  KvPool& pool = **created;
  ASSERT_EQ(pool.num_chunks(), 4);
  const size_t chunk = arena.chunk_bytes;
  // Address arithmetic of every id of every chunk.
  for (KvCacheDtype d : {KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0}) {
    const size_t block = arena.BlockLayout(d).BlockBytes();
    const int per_chunk = arena.BlocksPerChunk(d);
    for (int k = 0; k < pool.num_chunks(); ++k) {
      for (int b = k * per_chunk; b < (k + 1) * per_chunk; ++b) {
        ASSERT_GE(size_t(b) * block, size_t(k) * chunk) << KvCacheDtypeName(d) << " block " << b;
        ASSERT_LE(size_t(b + 1) * block, size_t(k + 1) * chunk)
            << KvCacheDtypeName(d) << " block " << b;
      }
    }
    EXPECT_EQ(size_t(pool.num_blocks(d)) * block, pool.num_bytes());
  }
  // Chunk 1 lent to float32 (ids 17..33), chunk 2 to q8_0 (ids 128..191):
  // fill the last block of chunk 1 and the first and last of chunk 2.
  std::vector<float> k(256), v(256);
  for (int i = 0; i < 256; ++i) {
    k[size_t(i)] = 1.0f + 0.01f * float(i);
    v[size_t(i)] = -1.0f - 0.02f * float(i);
  }
  std::vector<float> ks, vs;
  for (int p = 0; p < 16; ++p) {
    ks.insert(ks.end(), k.begin(), k.end());
    vs.insert(vs.end(), v.begin(), v.end());
  }
  const int32_t query_start[2] = {0, 16};
  const int32_t start_pos[1] = {0};
  const BatchLayout batch{1, query_start, start_pos};
  auto write = [&](KvCacheDtype d, int32_t id) {
    const int32_t ids[1] = {id};
    cpu::AppendKv(ks.data(), vs.data(), batch, LayerBlockTable{ids, 1, 1},
                  arena.BlockLayout(d), pool.data());
  };
  write(KvCacheDtype::kFloat32, 2 * 17 - 1);
  write(KvCacheDtype::kQ8_0, 2 * 64);
  write(KvCacheDtype::kQ8_0, 3 * 64 - 1);
  auto touched = [&](size_t begin, size_t end) {
    return std::any_of(pool.data() + begin, pool.data() + end, [](uint8_t b) { return b != 0; });
  };
  EXPECT_FALSE(touched(0, chunk)) << "chunk 0";
  EXPECT_FALSE(touched(3 * chunk, 4 * chunk)) << "chunk 3";
  // Inside chunk 1 only its last float32 block was written, to the chunk's end.
  EXPECT_FALSE(touched(chunk, 2 * chunk - 32768));
  EXPECT_TRUE(touched(2 * chunk - 4, 2 * chunk)) << "the last V row reaches the chunk's end";
  // Chunk 2: its first and last q8_0 blocks, nothing between.
  EXPECT_TRUE(touched(2 * chunk, 2 * chunk + 8704));
  EXPECT_FALSE(touched(2 * chunk + 8704, 3 * chunk - 8704));
  EXPECT_TRUE(touched(3 * chunk - 8704, 3 * chunk));
  // The float32 block holds the values written, at its place.
  float first_k = 0.0f, last_v = 0.0f;
  std::memcpy(&first_k, pool.data() + size_t(2 * 17 - 1) * 32768, 4);
  std::memcpy(&last_v, pool.data() + 2 * chunk - 4, 4);
  EXPECT_EQ(first_k, k[0]);
  EXPECT_EQ(last_v, v[255]);
}

}  // namespace
}  // namespace headway
