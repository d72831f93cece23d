// BlockArena: chunks lent to block classes and returned, multi-class
// allocation checks, and the "after evicting everything" check that lets
// one class take memory the other class's evictable blocks hold.
#include "coordinator/scheduling/block_arena.h"

#include <gtest/gtest.h>

#include <vector>

namespace headway {
namespace {

TEST(BlockArenaTest, OneClassOfOneBlockPerChunkIsAFreeList) {
  BlockArena arena(4, {1});
  EXPECT_EQ(arena.Allocate(0, 2), (std::vector<int32_t>{0, 1}));  // lowest first
  arena.Free(0, std::vector<int32_t>{0});
  arena.Free(0, std::vector<int32_t>{1});
  // Then the most recently freed first.
  EXPECT_EQ(arena.Allocate(0, 3), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(arena.num_free_chunks(), 1);
  EXPECT_EQ(arena.num_lent_chunks(0), 3);
}

TEST(BlockArenaTest, ChunksAreLentToOneClassAndComeBackWhenEmpty) {
  // Class 0: 2 blocks per chunk; class 1: 5 (the same bytes in smaller blocks).
  BlockArena arena(3, {2, 5});
  std::vector<int32_t> big = arena.Allocate(0, 3);  // two chunks for class 0
  EXPECT_EQ(arena.num_lent_chunks(0), 2);
  EXPECT_EQ(arena.num_free_lent(0), 1);
  std::vector<int32_t> small = arena.Allocate(1, 4);  // the last chunk
  EXPECT_EQ(arena.num_lent_chunks(1), 1);
  EXPECT_EQ(arena.num_free_chunks(), 0);
  for (int32_t id : big) EXPECT_EQ(arena.chunk_owner(arena.ChunkOf(0, id)), 0);
  for (int32_t id : small) EXPECT_EQ(arena.chunk_owner(arena.ChunkOf(1, id)), 1);

  const int64_t one_more_small[] = {0, 2};
  EXPECT_FALSE(arena.CanAllocate(one_more_small));  // 1 free small block, no chunk
  // Class 0 frees a whole chunk: class 1 can borrow it.
  const int chunk = arena.ChunkOf(0, big[0]);
  std::vector<int32_t> same_chunk;
  for (int32_t id : big) {
    if (arena.ChunkOf(0, id) == chunk) same_chunk.push_back(id);
  }
  arena.Free(0, same_chunk);
  EXPECT_EQ(arena.chunk_owner(chunk), -1);
  EXPECT_TRUE(arena.CanAllocate(one_more_small));
  std::vector<int32_t> more = arena.Allocate(1, 2);
  EXPECT_EQ(arena.num_lent_chunks(1), 2);
  // The fullest chunk with room is used first: block 5 of the old chunk,
  // then one from the chunk just borrowed.
  EXPECT_EQ(arena.ChunkOf(1, more[0]), arena.ChunkOf(1, small[0]));
  EXPECT_EQ(arena.ChunkOf(1, more[1]), chunk);
}

TEST(BlockArenaTest, CanAllocateSumsTheChunksEveryClassNeeds) {
  BlockArena arena(2, {2, 5});
  const int64_t both[] = {2, 5};
  const int64_t too_many[] = {3, 1};
  EXPECT_TRUE(arena.CanAllocate(both));
  EXPECT_FALSE(arena.CanAllocate(too_many));
}

TEST(BlockArenaTest, EvictingFreesChunksForTheOtherClass) {
  BlockArena arena(2, {2, 5});
  std::vector<int32_t> small = arena.Allocate(1, 6);  // both chunks
  const int64_t two_big[] = {2, 0};
  EXPECT_FALSE(arena.CanAllocateEvicting(two_big));
  // The blocks of the first chunk become evictable: evicting them all
  // returns that chunk, which class 0 can take.
  for (int i = 0; i < 5; ++i) arena.SetEvictable(1, small[size_t(i)], true);
  EXPECT_FALSE(arena.CanAllocate(two_big));
  EXPECT_TRUE(arena.CanAllocateEvicting(two_big));
  // Unless one of them is about to be held again.
  const ClassBlock kept[] = {{1, small[0]}};
  EXPECT_FALSE(arena.CanAllocateEvicting(two_big, kept));
  // Evictable blocks in a chunk that stays (some block held) count as free
  // blocks of their own class only.
  // (4 left beside the kept one, 4 beside block 5 in the second chunk.)
  const int64_t eight_small[] = {0, 8};
  EXPECT_TRUE(arena.CanAllocateEvicting(eight_small, kept));
  const int64_t nine_small[] = {0, 9};
  EXPECT_FALSE(arena.CanAllocateEvicting(nine_small, kept));
  arena.Free(1, std::vector<int32_t>(small.begin(), small.begin() + 5));
  EXPECT_EQ(arena.num_evictable(1), 0);
  EXPECT_TRUE(arena.CanAllocate(two_big));
}

TEST(BlockArenaDeathTest, DoubleFreeAborts) {
  BlockArena arena(2, {2});
  std::vector<int32_t> ids = arena.Allocate(0, 2);
  arena.Free(0, std::vector<int32_t>{ids[0]});
  EXPECT_DEATH(arena.Free(0, std::vector<int32_t>{ids[0]}), "");
}

}  // namespace
}  // namespace headway
