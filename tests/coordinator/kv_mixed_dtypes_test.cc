// KvCacheManager with two block classes (cache.kv_cache_dtype for full
// slots, cache.kv_cache_dtype_sliding for sliding ones) sharing one arena
// per rank: each slot's blocks come from chunks lent to its class, memory
// one class frees serves the other, and a randomized run over every
// operation keeps the arena consistent and never gives one byte to two
// blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "common/kv_arena.h"
#include "coordinator/scheduling/kv_cache_manager.h"
#include "tests/coordinator/fake_model_spec.h"
#include "tests/coordinator/random_sequences.h"

namespace headway {
namespace {

using testing::FamilyTokens;
using testing::FakeLlamaSpec;

constexpr int kBlock = 16;

// Layers alternate: even layers slide (every KV head), odd layers are full,
// as Gemma 3's layers do (head_dim 64).
ModelSpec AlternatingSpec(int num_layers, int window, int sink) {
  ModelSpec spec = FakeLlamaSpec(num_layers);
  for (int layer = 0; layer < num_layers; layer += 2) {
    for (int h = 0; h < spec.num_kv_heads; ++h) {
      SlotSpec& s = spec.slot_specs[size_t(layer) * spec.num_kv_heads + h];
      s.window = window;
      s.sink = sink;
    }
  }
  return spec;
}

KvCacheOptions MixedOptions() {
  KvCacheOptions o;
  o.dtypes = {KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0};
  return o;
}

// Every block some row, pin, reservation or cache entry could hold lies in
// one byte range of the rank's arena; no two allocated blocks overlap.
void ExpectNoSharedBytes(const KvCacheManager& kv, const KvArenaLayout& arena,
                         const std::vector<std::vector<std::pair<int, int32_t>>>& held_by_rank,
                         const char* after) {
  for (size_t r = 0; r < held_by_rank.size(); ++r) {
    std::vector<std::pair<size_t, size_t>> ranges;  // [begin, end) bytes
    for (const auto& [cls, id] : held_by_rank[r]) {
      const size_t bytes = arena.BlockLayout(kv.block_classes()[size_t(cls)]).BlockBytes();
      ranges.emplace_back(size_t(id) * bytes, size_t(id + 1) * bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      ASSERT_LE(ranges[i - 1].second, ranges[i].first)
          << after << ": rank " << r << " bytes [" << ranges[i].first << ", " << ranges[i].second
          << ") belong to two blocks";
    }
  }
}

TEST(KvMixedDtypesTest, OneClassUnlessBothKindsOfSlotAndTwoDtypes) {
  KvCacheOptions same;
  same.dtypes = {KvCacheDtype::kQ8_0, KvCacheDtype::kQ8_0};
  KvCacheManager uniform(AlternatingSpec(2, 32, 0), 1, kBlock, {10}, same);
  EXPECT_EQ(uniform.block_classes(), (std::vector<KvCacheDtype>{KvCacheDtype::kQ8_0}));
  EXPECT_EQ(uniform.shares_per_chunk(), 1);
  // No sliding slot: the sliding dtype is unused.
  KvCacheManager all_full(FakeLlamaSpec(2), 1, kBlock, {10}, MixedOptions());
  EXPECT_EQ(all_full.block_classes().size(), 1u);
  EXPECT_EQ(all_full.Usage(0).num_total, 10);

  KvCacheManager mixed(AlternatingSpec(2, 32, 0), 1, kBlock, {10}, MixedOptions());
  ASSERT_EQ(mixed.block_classes(),
            (std::vector<KvCacheDtype>{KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0}));
  // head_dim 64, 16 positions: f32 blocks of 8,192 bytes, q8_0 blocks of
  // 2,176; a chunk is their lcm, 139,264 bytes = 17 f32 or 64 q8_0 blocks.
  EXPECT_EQ(mixed.blocks_per_chunk(0), 17);
  EXPECT_EQ(mixed.blocks_per_chunk(1), 64);
  EXPECT_EQ(mixed.shares_per_chunk(), 17 * 64);
  EXPECT_EQ(mixed.slot_class(0, 0), 1);  // layer 0 slides
  EXPECT_EQ(mixed.slot_class(0, 3), 0);  // layer 1 is full
}

TEST(KvMixedDtypesTest, SlotsTakeBlocksOfTheirClassFromChunksLentToIt) {
  const ModelSpec spec = AlternatingSpec(2, 32, 0);
  KvCacheManager kv(spec, 1, kBlock, {4}, MixedOptions());
  ASSERT_TRUE(kv.CanAppend(1, 64));
  (void)kv.Append(1, 64);  // 4 blocks per slot, 3 slots of each class
  const RankBlockUsage u = kv.Usage(0);
  EXPECT_EQ(u.lent_chunks, (std::vector<int>{1, 1}));  // 12 f32 blocks <= 17, 12 q8_0 <= 64
  EXPECT_EQ(u.num_free_chunks, 2);
  EXPECT_EQ(u.used_shares, 12 * 64 + 12 * 17);
  ASSERT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
  kv.Release(1);
  EXPECT_EQ(kv.Usage(0).num_free_chunks, 4);
}

TEST(KvMixedDtypesTest, MemoryRecycledBySlidingSlotsServesFullSlots) {
  // 3 chunks. A long sequence's full slots fill most of one f32 chunk; its
  // sliding slots, recycled down to their windows, use a corner of one
  // q8_0 chunk, so the third chunk stays free for whichever class needs it.
  const ModelSpec spec = AlternatingSpec(2, 32, 0);
  KvCacheManager kv(spec, 1, kBlock, {3}, MixedOptions());
  // Positions [0, 80): 5 blocks per slot, full: 15 f32 blocks (1 chunk),
  // sliding: recycled down to the window's blocks.
  for (int64_t p = 0; p < 80; ++p) {
    (void)kv.Recycle(1, p);
    ASSERT_TRUE(kv.CanAppend(1, p + 1)) << p;
    (void)kv.Append(1, p + 1);
  }
  (void)kv.Recycle(1, 80);
  EXPECT_EQ(kv.Usage(0).lent_chunks, (std::vector<int>{1, 1}));
  // A second sequence with only full-slot needs beyond one chunk borrows the
  // free one; then a third finds none.
  ASSERT_TRUE(kv.CanAppend(2, 16));
  (void)kv.Append(2, 16);  // 3 more f32 blocks: 18 > 17, a second f32 chunk
  EXPECT_EQ(kv.Usage(0).lent_chunks, (std::vector<int>{2, 1}));
  EXPECT_EQ(kv.Usage(0).num_free_chunks, 0);
  // Ending the first sequence frees its blocks; the chunks sequence 2 still
  // uses stay lent.
  kv.Release(1);
  ASSERT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
  EXPECT_EQ(kv.Usage(0).lent_chunks[1], 1);  // sequence 2's sliding blocks
  kv.Release(2);
  EXPECT_EQ(kv.Usage(0).num_free_chunks, 3);
}

TEST(KvMixedDtypesTest, AFullArenaEvictsCachedBlocksForANewSequence) {
  // The arena is full of one finished sequence's cached blocks; a new,
  // unrelated sequence evicts the least recently used ones until its class
  // has room. (BlockArenaTest covers a chunk moving between classes.)
  const ModelSpec spec = AlternatingSpec(2, 1024, 0);  // nothing recycles
  KvCacheManager kv(spec, 1, kBlock, {2}, MixedOptions());
  const std::vector<int32_t> a = FamilyTokens(80, 1);  // 5 blocks per slot
  ASSERT_TRUE(kv.CanAppend(1, 80));
  (void)kv.Append(1, 80);
  kv.CacheComputedBlocks(1, TokenIds{a, {}}, 80);
  kv.Release(1);
  const RankBlockUsage cached = kv.Usage(0);
  EXPECT_EQ(cached.num_evictable, 30);
  EXPECT_EQ(cached.used_shares, 0);
  EXPECT_EQ(cached.num_free_chunks, 0);  // 15 f32 blocks in one chunk, 15 q8_0 in the other
  // 3 blocks per slot: 9 f32 blocks, 2 free in the f32 chunk.
  ASSERT_TRUE(kv.CanAppend(2, 48));
  (void)kv.Append(2, 48);
  const RankBlockUsage after = kv.Usage(0);
  EXPECT_LT(after.num_evictable, 30);
  EXPECT_GT(after.num_evictable, 0);  // only as many entries as it needed
  EXPECT_EQ(after.lent_chunks, (std::vector<int>{1, 1}));
  // 6 blocks per slot: 18 f32 blocks need both chunks, and q8_0 one more.
  EXPECT_FALSE(kv.CanAppend(2, 96));
  ASSERT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
}

// Random sequences start (with prefix hits), grow, recycle, cache and end;
// prefixes are pinned and unpinned; reservations are made, committed or
// cancelled; all on a small two-class arena at TP 1 and TP 3. After every
// operation the manager is consistent, the arena's chunks add up, and no
// byte belongs to two blocks.
void RunRandomized(int tp_size, uint32_t seed) {
  std::mt19937 rng(seed);
  const int window = 40, sink = 20;
  const ModelSpec spec = AlternatingSpec(4, window, sink);
  const KvCacheOptions options = MixedOptions();
  const KvArenaLayout arena =
      MakeKvArenaLayout(kBlock, spec.head_dim, options.dtypes, spec.slot_specs);
  const int num_chunks = 12;
  KvCacheManager kv(spec, tp_size, kBlock, std::vector<int>(size_t(tp_size), num_chunks), options);
  testing::RandomSequences seqs(&kv, &rng, /*footprints=*/true);
  std::vector<PinId> pins;
  std::vector<std::pair<ReservationId, std::vector<int32_t>>> reservations;
  int ops[8] = {};
  auto held = [&]() {
    auto by_rank = std::vector<std::vector<std::pair<int, int32_t>>>(size_t(tp_size));
    for (int r = 0; r < tp_size; ++r) {
      // Rows of every table, and every cache entry's blocks: deduplicated.
      std::vector<std::pair<int, int32_t>>& out = by_rank[size_t(r)];
      auto add_rows = [&](const std::vector<std::vector<int32_t>>& rows) {
        for (size_t s = 0; s < rows.size(); ++s) {
          for (int32_t b : rows[s]) {
            if (b >= 0) out.emplace_back(kv.slot_class(r, int(s)), b);
          }
        }
      };
      for (const auto& [id, s] : seqs.live()) add_rows(kv.Rows(id, r));
      for (PinId p : pins) add_rows(kv.Rows(p, r));
      for (const auto& [res, t] : reservations) add_rows(kv.Rows(res, r));
      for (CacheEntryId e : kv.prefix_cache().EntryIds()) {
        const std::vector<int32_t>& blocks = kv.prefix_cache().blocks(e)[size_t(r)];
        for (size_t s = 0; s < blocks.size(); ++s) {
          if (blocks[s] >= 0) out.emplace_back(kv.slot_class(r, int(s)), blocks[s]);
        }
      }
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
    }
    return by_rank;
  };
  auto check = [&](const char* after) {
    ASSERT_TRUE(kv.CheckConsistency().ok()) << after << ": " << kv.CheckConsistency().ToString();
    for (int r = 0; r < tp_size; ++r) {
      const RankBlockUsage u = kv.Usage(r);
      int lent = 0;
      for (int n : u.lent_chunks) lent += n;
      ASSERT_EQ(u.num_free_chunks + lent, num_chunks) << after;
    }
    ExpectNoSharedBytes(kv, arena, held(), after);
  };
  for (int step = 0; step < 2500; ++step) {
    const int op = int(rng() % 12);
    if (op < 2 && seqs.size() < 6) {
      if (seqs.TryStart() < 0) continue;
      ++ops[0];
      check("start");
    } else if (op < 7 && !seqs.empty()) {
      const uint64_t id = seqs.RecycleOne();
      check("recycle");
      if (!seqs.TryAppend(id)) continue;
      ++ops[1];
      check("append");
    } else if (op < 8 && !seqs.empty()) {
      seqs.ReleaseOne();
      ++ops[2];
      check("release");
    } else if (op < 9 && pins.size() < 3) {
      // Pin the cached prefix of a random family, as a sender does.
      const std::vector<int32_t> t = FamilyTokens(200, int(rng() % 3));
      PrefixMatch m = kv.MatchPrefix(TokenIds{t, {}}, 199);
      if (m.entries.empty() || !kv.CanPin(m)) continue;
      pins.push_back(kv.Pin(m));
      ++ops[3];
      check("pin");
    } else if (op < 10 && !pins.empty()) {
      kv.Unpin(pins.back());
      pins.pop_back();
      ++ops[4];
      check("unpin");
    } else if (op < 11 && reservations.size() < 2) {
      // Reserve room to receive a prompt, as a receiver does.
      std::vector<int32_t> t = FamilyTokens(32 + int(rng() % 120), 3 + int(rng() % 2));
      PrefixMatch have = kv.MatchPrefix(TokenIds{t, {}}, int64_t(t.size()) - 1);
      if (!kv.CanReserve(have, int64_t(t.size()))) continue;
      reservations.emplace_back(kv.Reserve(have, int64_t(t.size())), std::move(t));
      ++ops[5];
      check("reserve");
    } else if (!reservations.empty()) {
      auto [res, t] = reservations.back();
      reservations.pop_back();
      if (rng() % 2 == 0) {
        kv.CommitReceived(res, TokenIds{t, {}}, int64_t(t.size()));
        ++ops[6];
        check("commit");
      } else {
        kv.CancelReservation(res);
        ++ops[7];
        check("cancel");
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int i = 0; i < 8; ++i) EXPECT_GT(ops[i], 0) << "operation " << i << " never ran";
  seqs.ReleaseAll();
  for (PinId p : pins) kv.Unpin(p);
  pins.clear();
  for (const auto& [res, t] : reservations) kv.CancelReservation(res);
  reservations.clear();
  check("end");
  // Everything left is evictable cache: one more sequence as large as the
  // arena allows evicts it all and every chunk is reachable again.
  for (int r = 0; r < tp_size; ++r) {
    EXPECT_EQ(kv.Usage(r).used_shares, 0);
  }
}

TEST(KvMixedDtypesTest, RandomizedOwnersShareTheArenaWithoutOverlapTp1) { RunRandomized(1, 7); }
TEST(KvMixedDtypesTest, RandomizedOwnersShareTheArenaWithoutOverlapTp3) { RunRandomized(3, 11); }

}  // namespace
}  // namespace headway
