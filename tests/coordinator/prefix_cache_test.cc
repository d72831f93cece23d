#include "coordinator/scheduling/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "coordinator/scheduling/kv_cache_manager.h"
#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeLlamaSpec;

constexpr int kBlockSize = 4;

BlockHash ConstantHash(BlockHash, std::span<const int32_t>) { return 42; }

std::vector<int32_t> Iota(int n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TokenIds Tokens(const std::vector<int32_t>& prompt) { return TokenIds{prompt, {}}; }

void ExpectConsistent(const KvCacheManager& kv) {
  Status s = kv.CheckConsistency();
  EXPECT_TRUE(s.ok()) << s.message();
}

// ---- PrefixCache ------------------------------------------------------

TEST(PrefixCacheTest, HashChainCoversParentTokensAndOrder) {
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 4, 3};
  EXPECT_EQ(HashBlockTokens(kRootBlockHash, a), HashBlockTokens(kRootBlockHash, a));
  EXPECT_NE(HashBlockTokens(kRootBlockHash, a), HashBlockTokens(kRootBlockHash, b));
  BlockHash h = HashBlockTokens(kRootBlockHash, a);
  EXPECT_NE(HashBlockTokens(h, a), HashBlockTokens(kRootBlockHash, a));
  EXPECT_NE(HashBlockTokens(h, a), HashBlockTokens(HashBlockTokens(kRootBlockHash, b), a));
  // Equal token values at different offsets do not cancel.
  EXPECT_NE(HashBlockTokens(kRootBlockHash, std::vector<int32_t>{7, 7, 0, 0}),
            HashBlockTokens(kRootBlockHash, std::vector<int32_t>{0, 0, 7, 7}));
}

TEST(PrefixCacheTest, FindVerifiesParentAndTokens) {
  PrefixCache cache(1);
  std::vector<int32_t> a = {1, 2, 3, 4};
  BlockHash h = cache.Hash(kRootBlockHash, a);
  PrefixCache::InsertResult r = cache.Insert(h, kNoCacheEntry, a, {{10, 11}});
  ASSERT_EQ(r.outcome, PrefixCache::InsertOutcome::kInserted);
  EXPECT_EQ(cache.Find(h, kNoCacheEntry, a), r.id);
  EXPECT_EQ(cache.Find(h, r.id, a), kNoCacheEntry);  // wrong parent
  EXPECT_EQ(cache.Find(h, kNoCacheEntry, std::vector<int32_t>{1, 2, 3, 5}), kNoCacheEntry);
  // Same content again: a duplicate, the existing entry is named.
  PrefixCache::InsertResult d = cache.Insert(h, kNoCacheEntry, a, {{20, 21}});
  EXPECT_EQ(d.outcome, PrefixCache::InsertOutcome::kDuplicate);
  EXPECT_EQ(d.id, r.id);
  EXPECT_EQ(cache.refcount(r.id), 1);
  EXPECT_EQ(cache.blocks(r.id), (std::vector<std::vector<int32_t>>{{10, 11}}));
}

TEST(PrefixCacheTest, RefcountsAndLruOrder) {
  PrefixCache cache(2);
  std::vector<CacheEntryId> ids;
  for (int32_t i = 0; i < 3; ++i) {
    std::vector<int32_t> t = {i, i, i, i};
    ids.push_back(cache.Insert(cache.Hash(kRootBlockHash, t), kNoCacheEntry, t,
                               {{2 * i, 2 * i + 1}, {2 * i}})
                      .id);
  }
  EXPECT_EQ(cache.num_evictable_entries(), 0u);
  cache.Acquire(ids[1]);  // two holders
  cache.Release(ids[1]);
  EXPECT_EQ(cache.refcount(ids[1]), 1);
  cache.Release(ids[2]);
  cache.Release(ids[0]);
  cache.Release(ids[1]);
  EXPECT_EQ(cache.LruOrder(), (std::vector<CacheEntryId>{ids[2], ids[0], ids[1]}));
  EXPECT_EQ(cache.num_evictable_blocks(0), 6);
  EXPECT_EQ(cache.num_evictable_blocks(1), 3);
  // A hit makes an entry unevictable again; released, it is the newest.
  cache.Acquire(ids[2]);
  EXPECT_EQ(cache.num_evictable_blocks(0), 4);
  cache.Release(ids[2]);
  EXPECT_EQ(cache.LruOrder(), (std::vector<CacheEntryId>{ids[0], ids[1], ids[2]}));
  EXPECT_EQ(cache.EvictLru(), (std::vector<std::vector<int32_t>>{{0, 1}, {0}}));
  EXPECT_FALSE(cache.Contains(ids[0]));
  std::vector<int32_t> t0 = {0, 0, 0, 0};
  EXPECT_EQ(cache.Find(cache.Hash(kRootBlockHash, t0), kNoCacheEntry, t0), kNoCacheEntry);
  EXPECT_EQ(cache.num_evicted(), 1u);
  EXPECT_EQ(cache.num_evictable_blocks(0), 4);
}

TEST(PrefixCacheTest, CollisionNeverReturnsAnotherBlock) {
  PrefixCache cache(1, ConstantHash);
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  CacheEntryId ea = cache.Insert(42, kNoCacheEntry, a, {{1}}).id;
  EXPECT_EQ(cache.Find(42, kNoCacheEntry, b), kNoCacheEntry);
  // b takes the index; a stays valid for its holder, found no more.
  CacheEntryId eb = cache.Insert(42, kNoCacheEntry, b, {{2}}).id;
  EXPECT_NE(ea, eb);
  EXPECT_EQ(cache.Find(42, kNoCacheEntry, a), kNoCacheEntry);
  EXPECT_EQ(cache.Find(42, kNoCacheEntry, b), eb);
  EXPECT_EQ(cache.blocks(ea), (std::vector<std::vector<int32_t>>{{1}}));
  cache.Release(ea);
  cache.Release(eb);
  EXPECT_EQ(cache.EvictLru(), (std::vector<std::vector<int32_t>>{{1}}));
  EXPECT_EQ(cache.Find(42, kNoCacheEntry, b), eb);  // evicting a did not unindex b
}

// ---- KvCacheManager with the prefix cache --------------------------------

// Starts `id` with its longest cached prefix, computes it to the end of the
// prompt and caches its full blocks. Returns the hit length.
int64_t RunPrompt(KvCacheManager& kv, uint64_t id, const std::vector<int32_t>& prompt) {
  PrefixMatch m = kv.MatchPrefix(Tokens(prompt), int64_t(prompt.size()) - 1);
  EXPECT_TRUE(kv.CanStart(m, int64_t(prompt.size())));
  (void)kv.Start(id, m, int64_t(prompt.size()));
  kv.CacheComputedBlocks(id, Tokens(prompt), int64_t(prompt.size()));
  ExpectConsistent(kv);
  return m.num_positions;
}

TEST(KvPrefixCacheTest, HitsAtBlockBoundariesAndLeaveOneTokenToCompute) {
  KvCacheManager kv(FakeLlamaSpec(2), 1, kBlockSize, {200});
  std::vector<int32_t> a = Iota(10, 100);  // blocks [0,4) [4,8) cached, [8,10) partial
  EXPECT_EQ(RunPrompt(kv, 1, a), 0);
  EXPECT_EQ(kv.prefix_cache().num_entries(), 2u);
  auto prefix = [&](int n) { return std::vector<int32_t>(a.begin(), a.begin() + n); };
  EXPECT_EQ(kv.MatchPrefix(Tokens(Concat(prefix(8), {1, 2})), 9).num_positions, 8);
  EXPECT_EQ(kv.MatchPrefix(Tokens(Concat(prefix(7), {1, 2})), 8).num_positions, 4);
  EXPECT_EQ(kv.MatchPrefix(Tokens(prefix(9)), 8).num_positions, 8);
  // The whole prompt cached: the last block is left to compute for logits.
  EXPECT_EQ(kv.MatchPrefix(Tokens(prefix(8)), 7).num_positions, 4);
  EXPECT_EQ(kv.MatchPrefix(Tokens(prefix(3)), 2).num_positions, 0);
  EXPECT_EQ(kv.MatchPrefix(Tokens(Concat({0}, a)), 10).num_positions, 0);
}

TEST(KvPrefixCacheTest, StartSharesBlocksAndDeltasBeginAtLogicalZero) {
  for (int tp : {1, 3}) {
    KvCacheManager kv(FakeLlamaSpec(2), tp, kBlockSize, std::vector<int>(tp, 100));
    std::vector<int32_t> a = Iota(10, 100);
    RunPrompt(kv, 1, a);
    std::vector<int32_t> b = Concat(std::vector<int32_t>(a.begin(), a.begin() + 8), {7, 7, 7});
    PrefixMatch m = kv.MatchPrefix(Tokens(b), 10);
    ASSERT_EQ(m.num_positions, 8);
    auto deltas = kv.Start(2, m, 11);
    ASSERT_EQ(int(deltas.size()), tp);
    for (int r = 0; r < tp; ++r) {
      ASSERT_EQ(int(deltas[r].size()), kv.num_slots(r));
      for (const SlotBlockDelta& d : deltas[r]) {
        EXPECT_EQ(d.first_logical, 0);
        ASSERT_EQ(d.appended.size(), 3u);
        EXPECT_EQ(d.appended, kv.TEST_Row(2, r, d.slot));
        const std::vector<int32_t>& row_a = kv.TEST_Row(1, r, d.slot);
        EXPECT_EQ(d.appended[0], row_a[0]);  // shared
        EXPECT_EQ(d.appended[1], row_a[1]);
        EXPECT_NE(d.appended[2], row_a[2]);  // its own
      }
    }
    ExpectConsistent(kv);
    for (int r = 0; r < tp; ++r) {
      // a: 3 blocks per slot, b: 1 more; nothing evictable while both run.
      RankBlockUsage u = kv.Usage(r);
      EXPECT_EQ(u.num_referenced, 4 * kv.num_slots(r));
      EXPECT_EQ(u.num_evictable, 0);
    }
    kv.Release(1);
    ExpectConsistent(kv);
    EXPECT_EQ(kv.Usage(0).num_evictable, 0);  // b still references both
    kv.Release(2);
    ExpectConsistent(kv);
    for (int r = 0; r < tp; ++r) {
      // Two cached blocks per slot stay resident; the partial ones are back.
      RankBlockUsage u = kv.Usage(r);
      EXPECT_EQ(u.num_evictable, 2 * kv.num_slots(r));
      EXPECT_EQ(u.num_free, 100);
      EXPECT_EQ(u.num_referenced, 0);
    }
  }
}

TEST(KvPrefixCacheTest, OnlyComputedFullBlocksAreCached) {
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {100});
  std::vector<int32_t> a = Iota(12, 0);
  (void)kv.Start(1, PrefixMatch{}, 12);
  kv.CacheComputedBlocks(1, Tokens(a), 7);  // block 0 computed, block 1 not full yet
  EXPECT_EQ(kv.prefix_cache().num_entries(), 1u);
  kv.CacheComputedBlocks(1, Tokens(a), 12);
  EXPECT_EQ(kv.prefix_cache().num_entries(), 3u);
  kv.Release(1);
  ExpectConsistent(kv);
  // A sequence released before its blocks were computed caches nothing.
  (void)kv.Start(2, PrefixMatch{}, 12);
  kv.Release(2);
  EXPECT_EQ(kv.prefix_cache().num_entries(), 3u);
  EXPECT_EQ(kv.Usage(0).num_evictable, 3 * kv.num_slots(0));
  ExpectConsistent(kv);
}

TEST(KvPrefixCacheTest, DuplicateBlocksStayPrivateAndTheChainContinues) {
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {100});
  std::vector<int32_t> a = Iota(9, 0);
  // Both start before either is computed: no hit, two copies of block 0.
  (void)kv.Start(1, PrefixMatch{}, 9);
  (void)kv.Start(2, PrefixMatch{}, 6);
  kv.CacheComputedBlocks(1, Tokens(a), 4);
  kv.CacheComputedBlocks(2, Tokens(a), 6);  // block 0 duplicate
  EXPECT_EQ(kv.prefix_cache().num_entries(), 1u);
  ASSERT_TRUE(kv.CanAppend(2, 9));
  (void)kv.Append(2, 9);
  kv.CacheComputedBlocks(2, Tokens(a), 9);  // block 1: a new entry under 1's block 0
  EXPECT_EQ(kv.prefix_cache().num_entries(), 2u);
  ExpectConsistent(kv);
  kv.Release(1);
  kv.Release(2);
  ExpectConsistent(kv);
  EXPECT_EQ(kv.MatchPrefix(Tokens(Concat(a, {5})), 9).num_positions, 8);
  EXPECT_EQ(kv.Usage(0).num_evictable, 2 * kv.num_slots(0));
}

TEST(KvPrefixCacheTest, EvictsLeastRecentlyReleasedWhenThePoolIsShort) {
  // 1 layer x 3 KV heads = 3 slots; 12 blocks = 4 logical blocks.
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {12});
  std::vector<int32_t> x = Iota(5, 0), y = Iota(5, 100), z = Iota(5, 200);
  RunPrompt(kv, 1, x);
  RunPrompt(kv, 2, y);
  kv.Release(2);
  kv.Release(1);
  ExpectConsistent(kv);
  EXPECT_EQ(kv.Usage(0).num_evictable, 6);
  EXPECT_EQ(kv.Usage(0).num_free, 12);
  // z needs 2 logical blocks: the 2 unused ones. Then one more: y's entry
  // (released first) goes.
  RunPrompt(kv, 3, z);
  EXPECT_EQ(kv.prefix_cache().num_evicted(), 0u);
  ASSERT_TRUE(kv.CanAppend(3, 9));
  (void)kv.Append(3, 9);
  ExpectConsistent(kv);
  EXPECT_EQ(kv.prefix_cache().num_evicted(), 1u);
  EXPECT_EQ(kv.MatchPrefix(Tokens(Concat(y, {1})), 5).num_positions, 0);
  EXPECT_EQ(kv.MatchPrefix(Tokens(Concat(x, {1})), 5).num_positions, 4);
  // Not more than unused + evictable.
  EXPECT_FALSE(kv.CanAppend(3, 17));
  EXPECT_TRUE(kv.CanAppend(3, 13));
}

TEST(KvPrefixCacheTest, ReleasedTailIsEvictedBeforeItsPrefix) {
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {15});  // 5 logical blocks
  std::vector<int32_t> a = Iota(13, 0);                       // 3 full + 1 partial
  RunPrompt(kv, 1, a);
  kv.Release(1);
  // 2 logical blocks are unused; 3 need one eviction: a's third block.
  (void)kv.Start(2, PrefixMatch{}, 9);
  ExpectConsistent(kv);
  EXPECT_EQ(kv.MatchPrefix(Tokens(a), 12).num_positions, 8);
}

TEST(KvPrefixCacheTest, CanStartDoesNotCountTheHitsOwnBlocksAsEvictable) {
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {9});  // 3 logical blocks
  std::vector<int32_t> a = Iota(9, 0);
  RunPrompt(kv, 1, a);  // 3 blocks: 2 cached + 1 partial
  kv.Release(1);
  std::vector<int32_t> b = Concat(std::vector<int32_t>(a.begin(), a.begin() + 8), Iota(5, 50));
  PrefixMatch m = kv.MatchPrefix(Tokens(b), 12);
  ASSERT_EQ(m.num_positions, 8);
  // 13 positions = 4 logical blocks > 3 in the pool, even though the pool
  // has 3 "free" (unused + evictable) for the 2 it needs beyond the hit.
  EXPECT_FALSE(kv.CanStart(m, 13));
  EXPECT_TRUE(kv.CanStart(m, 12));
  (void)kv.Start(2, m, 12);
  ExpectConsistent(kv);
  EXPECT_EQ(kv.Usage(0).num_free, 0);
}

TEST(KvPrefixCacheTest, ForcedCollisionsNeverShareWrongBlocks) {
  KvCacheOptions options;
  options.block_hasher = ConstantHash;
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {60}, options);
  std::vector<int32_t> a = Iota(5, 0), b = Iota(5, 100);
  RunPrompt(kv, 1, a);
  // Every block hashes the same: only a block with a's tokens may hit.
  EXPECT_EQ(RunPrompt(kv, 2, b), 0);
  EXPECT_EQ(kv.MatchPrefix(Tokens(a), 4).num_positions, 0);  // b's block took the index
  EXPECT_EQ(kv.MatchPrefix(Tokens(b), 4).num_positions, 4);
  PrefixMatch m = kv.MatchPrefix(Tokens(b), 4);
  (void)kv.Start(3, m, 5);
  EXPECT_EQ(kv.TEST_Row(3, 0, 0)[0], kv.TEST_Row(2, 0, 0)[0]);
  EXPECT_NE(kv.TEST_Row(3, 0, 0)[0], kv.TEST_Row(1, 0, 0)[0]);
  // A longer chain: block 1 collides with block 0 and never matches it.
  std::vector<int32_t> c = Iota(13, 500);
  RunPrompt(kv, 4, c);
  EXPECT_EQ(kv.MatchPrefix(Tokens(c), 12).num_positions, 0);
  for (uint64_t id : {1, 2, 3, 4}) kv.Release(id);
  ExpectConsistent(kv);
}

TEST(KvPrefixCacheTest, DisabledCachesNothing) {
  KvCacheOptions options;
  options.enable_prefix_caching = false;
  KvCacheManager kv(FakeLlamaSpec(1), 1, kBlockSize, {60}, options);
  std::vector<int32_t> a = Iota(9, 0);
  EXPECT_EQ(RunPrompt(kv, 1, a), 0);
  kv.Release(1);
  EXPECT_EQ(kv.prefix_cache().num_entries(), 0u);
  EXPECT_EQ(RunPrompt(kv, 2, a), 0);
  kv.Release(2);
  EXPECT_EQ(kv.Usage(0).num_evictable, 0);
  EXPECT_EQ(kv.Usage(0).num_free, 60);
}

}  // namespace
}  // namespace headway
