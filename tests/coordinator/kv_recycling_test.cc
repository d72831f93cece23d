// Sliding-window recycling in the KvCacheManager (DESIGN.md "Recycling"):
// window and sink edges, the prefix cache's per-block holders and its hit
// cut, and a randomized run checking that no -1 entry ever lies inside a live
// window or sink.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "coordinator/scheduling/kv_cache_manager.h"
#include "tests/coordinator/fake_model_spec.h"
#include "tests/coordinator/random_sequences.h"

namespace headway {
namespace {

using testing::FamilyTokens;
using testing::FakeLlamaSpec;

constexpr int kBlock = 16;

// 2 layers x 3 KV heads; on every layer KV head 0 is sliding.
ModelSpec SlidingSpec(int window, int sink) {
  ModelSpec spec = FakeLlamaSpec(2);
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    SlotSpec& s = spec.slot_specs[size_t(layer) * spec.num_kv_heads];
    s.window = window;
    s.sink = sink;
  }
  return spec;
}

// Logical blocks of `row` that hold a block.
std::vector<int> Live(const std::vector<int32_t>& row) {
  std::vector<int> live;
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] >= 0) live.push_back(int(i));
  }
  return live;
}

// Computes positions [0, end) of `seq` one position at a time, recycling
// before each step as the scheduler does.
void ComputeUpTo(KvCacheManager& kv, uint64_t seq, int64_t from, int64_t end) {
  for (int64_t p = from; p < end; ++p) {
    (void)kv.Recycle(seq, p);
    ASSERT_TRUE(kv.CanAppend(seq, p + 1));
    (void)kv.Append(seq, p + 1);
  }
  (void)kv.Recycle(seq, end);
}

TEST(KvRecyclingTest, WindowEdges) {
  // Window 32 = 2 blocks, no sink: block 0 leaves the window once the first
  // uncomputed position p has p - 32 + 1 >= 16.
  KvCacheManager kv(SlidingSpec(32, 0), 1, kBlock, {200});
  const int sliding = 0, full = 1;  // slots of layer 0
  ComputeUpTo(kv, 1, 0, 31);        // p = window - 1
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, sliding)), (std::vector<int>{0, 1}));
  ComputeUpTo(kv, 1, 31, 32);       // p = window
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, sliding)), (std::vector<int>{0, 1}));
  ComputeUpTo(kv, 1, 32, 33);       // p = window + 1: keys 2.. still need block 0
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, sliding)), (std::vector<int>{0, 1, 2}));
  ComputeUpTo(kv, 1, 33, 47);       // p = 47: keys from 16 on
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, sliding)), (std::vector<int>{1, 2}));
  EXPECT_EQ(kv.TEST_Row(1, 0, sliding)[0], -1);
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, full)).size(), 3u);  // full slots keep everything
  EXPECT_EQ(kv.num_recycled_blocks(), 2u);               // one per layer
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
}

TEST(KvRecyclingTest, SinkEndingMidBlockKeepsItsBlocks) {
  // Sink 20 positions: blocks 0 and 1 are sink blocks and never recycled.
  KvCacheManager kv(SlidingSpec(32, 20), 1, kBlock, {400});
  ComputeUpTo(kv, 1, 0, 200);
  const std::vector<int> live = Live(kv.TEST_Row(1, 0, 0));
  // p = 200: keys from 169 on, blocks 10.. (block 10 covers [160, 176)).
  EXPECT_EQ(live, (std::vector<int>{0, 1, 10, 11, 12}));
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
}

// A table started at a late first uncomputed position (the receiving side
// of a transfer) takes the sink blocks and the window's, nothing between.
TEST(KvRecyclingTest, LateStartSkipsTheGapBetweenSinkAndWindow) {
  KvCacheManager kv(SlidingSpec(32, 20), 1, kBlock, {400});
  const int free_before = kv.Usage(0).num_free;
  ASSERT_TRUE(kv.CanStart(PrefixMatch{}, 320, 320));
  auto deltas = kv.Start(1, PrefixMatch{}, 320, 320);
  // p = 320: keys from 289 on, blocks 18, 19; sink blocks 0, 1.
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, 0)), (std::vector<int>{0, 1, 18, 19}));
  EXPECT_EQ(kv.TEST_Row(1, 0, 0).size(), 20u);
  EXPECT_EQ(free_before - kv.Usage(0).num_free, 4 * 20 + 2 * 4);
  int sliding_runs = 0;
  for (const SlotBlockDelta& d : deltas[0]) sliding_runs += d.slot % 3 == 0;
  EXPECT_EQ(sliding_runs, 4);  // two runs per sliding slot
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
}

TEST(KvRecyclingTest, RecycleDeltasNameTheIndices) {
  KvCacheManager kv(SlidingSpec(32, 0), 1, kBlock, {200});
  ComputeUpTo(kv, 1, 0, 47);
  auto deltas = kv.Recycle(1, 80);  // keys from 49 on: blocks 1 and 2 go
  ASSERT_EQ(deltas[0].size(), 2u);  // the sliding slot of each layer
  for (const SlotBlockDelta& d : deltas[0]) {
    EXPECT_TRUE(d.appended.empty());
    EXPECT_EQ(d.recycled, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(d.first_logical, 3);
  }
  EXPECT_TRUE(kv.Recycle(1, 80)[0].empty());  // nothing twice
}

TEST(KvRecyclingTest, RecycledBlocksGoBackToThePool) {
  const ModelSpec spec = SlidingSpec(32, 0);
  KvCacheManager with(spec, 1, kBlock, {2000});
  KvCacheManager without(FakeLlamaSpec(2), 1, kBlock, {2000});
  ComputeUpTo(with, 1, 0, 1024);
  ComputeUpTo(without, 1, 0, 1024);
  // 64 blocks per full slot; the 2 sliding slots keep 2 each (62, 63).
  EXPECT_EQ(2000 - without.Usage(0).num_free, 6 * 64);
  EXPECT_EQ(2000 - with.Usage(0).num_free, 4 * 64 + 2 * 2);
  with.Release(1);
  EXPECT_EQ(with.Usage(0).num_free, 2000);
  EXPECT_TRUE(with.CheckConsistency().ok()) << with.CheckConsistency().ToString();
}

TEST(KvRecyclingTest, RecyclingOffKeepsEveryBlock) {
  KvCacheOptions options;
  options.enable_recycling = false;
  KvCacheManager kv(SlidingSpec(32, 0), 1, kBlock, {2000}, options);
  ComputeUpTo(kv, 1, 0, 1024);
  EXPECT_EQ(2000 - kv.Usage(0).num_free, 6 * 64);
  EXPECT_EQ(kv.num_recycled_blocks(), 0u);
  EXPECT_EQ(Live(kv.TEST_Row(1, 0, 0)).size(), 64u);
}

// Per-layer granularity (the baseline of bench/recycling_bench.py): a layer
// with one streaming and two full KV heads keeps every block, as an
// allocator with one block table per layer must; a layer whose KV heads all
// slide alike still recycles.
TEST(KvRecyclingTest, LayerGranularityRecyclesOnlyUniformLayers) {
  ModelSpec spec = SlidingSpec(32, 0);  // layers 0 and 1: KV head 0 slides
  for (int h = 0; h < spec.num_kv_heads; ++h) {
    spec.slot_specs[size_t(spec.num_kv_heads) + h] = SlotSpec{32, 0};  // all of layer 1
  }
  KvCacheOptions options;
  options.recycling_granularity = KvCacheOptions::Granularity::kLayer;
  const std::vector<SlotSpec> kept =
      KvCacheManager::BookkeepingSpecs(spec, options.recycling_granularity);
  ASSERT_EQ(kept.size(), 6u);
  for (int h = 0; h < 3; ++h) {
    EXPECT_FALSE(kept[size_t(h)].IsSliding()) << "mixed layer 0, KV head " << h;
    EXPECT_EQ(kept[size_t(3 + h)].window, 32) << "uniform layer 1, KV head " << h;
  }
  KvCacheManager by_layer(spec, 1, kBlock, {2000}, options);
  KvCacheManager by_head(spec, 1, kBlock, {2000});
  ComputeUpTo(by_layer, 1, 0, 1024);
  ComputeUpTo(by_head, 1, 0, 1024);
  // 64 blocks per kept slot, 2 per recycling one (the window's 32 positions
  // straddle two blocks).
  EXPECT_EQ(2000 - by_layer.Usage(0).num_free, 3 * 64 + 3 * 2);
  EXPECT_EQ(2000 - by_head.Usage(0).num_free, 2 * 64 + 4 * 2);
  EXPECT_TRUE(by_layer.CheckConsistency().ok()) << by_layer.CheckConsistency().ToString();
}

// Admission's bound counts recycling: a sequence of the longest admitted
// length, computed alone in chunks of the scheduler's size (recycling before
// each step, as the scheduler does), always finds its blocks; and the bound
// exceeds the all-blocks-kept one.
TEST(KvRecyclingTest, MaxPositionsPerSequenceCountsRecycling) {
  struct Case {
    int window, sink, chunk;
  };
  for (const Case& c : {Case{32, 0, 1}, Case{32, 0, 48}, Case{64, 20, 16}, Case{17, 5, 33}}) {
    SCOPED_TRACE("window " + std::to_string(c.window) + " sink " + std::to_string(c.sink) +
                 " chunk " + std::to_string(c.chunk));
    const ModelSpec spec = SlidingSpec(c.window, c.sink);
    KvCacheOptions off;
    off.enable_recycling = false;
    KvCacheManager kept(spec, 1, kBlock, {600}, off);
    KvCacheManager kv(spec, 1, kBlock, {600});
    const int64_t most = kv.MaxPositionsPerSequence(c.chunk);
    EXPECT_EQ(kept.MaxPositionsPerSequence(c.chunk), 600 / 6 * kBlock);
    EXPECT_GT(most, kept.MaxPositionsPerSequence(c.chunk));
    for (int64_t p = 0; p < most; p += c.chunk) {
      const int64_t end = std::min<int64_t>(most, p + c.chunk);
      (void)kv.Recycle(1, p);
      ASSERT_TRUE(kv.CanAppend(1, end)) << "positions " << p << ".." << end << " of " << most;
      (void)kv.Append(1, end);
    }
    EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
  }
}

TEST(KvRecyclingTest, CachedBlocksAreFreedWhenTheLastHolderDropsThem) {
  KvCacheManager kv(SlidingSpec(32, 0), 1, kBlock, {2000});
  const std::vector<int32_t> prompt = FamilyTokens(160, 1);
  const TokenIds ids{prompt, {}};
  // A: 10 blocks, cached after the step that computes them.
  ASSERT_TRUE(kv.CanAppend(1, 160));
  (void)kv.Append(1, 160);
  kv.CacheComputedBlocks(1, ids, 160);
  const int free_before = kv.Usage(0).num_free;
  // B shares the whole prefix while A still runs: the hit needs the window
  // of position 160 (blocks 8, 9) and gets every entry.
  PrefixMatch match = kv.MatchPrefix(ids, 160);
  EXPECT_EQ(match.num_positions, 160);
  ASSERT_TRUE(kv.CanStart(match, 161));
  (void)kv.Start(2, match, 161);
  // B dropped blocks 0..7 of its sliding slots, but A still holds them.
  EXPECT_EQ(kv.TEST_Row(2, 0, 0)[0], -1);
  EXPECT_GE(kv.TEST_Row(1, 0, 0)[0], 0);
  // A's window moves on: now nobody holds blocks 0..7 of the sliding slots.
  (void)kv.Recycle(1, 160);
  EXPECT_EQ(kv.Usage(0).num_free, free_before - 6 /* B's block 10 */ + 2 * 8);
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();

  // A prefix of 5 blocks (80 positions) needs blocks 3 and 4 of the sliding
  // slots, which are gone: the hit is cut to nothing (no sink).
  const std::vector<int32_t> shorter(prompt.begin(), prompt.begin() + 81);
  PrefixMatch cut = kv.MatchPrefix(TokenIds{shorter, {}}, 80);
  EXPECT_EQ(cut.num_positions, 0);
  kv.Release(1);
  kv.Release(2);
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
  // The whole prefix still hits: its window blocks stayed cached.
  EXPECT_EQ(kv.MatchPrefix(ids, 160).num_positions, 160);
}

TEST(KvRecyclingTest, SinkBlocksKeepShorterHitsAlive) {
  // With a sink of 2 blocks, a hit of L needs blocks 0, 1 and those from
  // floor((L - 31) / 16): the cut stops where those are resident.
  KvCacheManager kv(SlidingSpec(32, 32), 1, kBlock, {2000});
  const std::vector<int32_t> prompt = FamilyTokens(320, 2);
  ComputeUpTo(kv, 1, 0, 320);
  kv.CacheComputedBlocks(1, TokenIds{prompt, {}}, 320);
  (void)kv.Recycle(1, 320);
  kv.Release(1);
  // Blocks 0, 1 (sink) and 18, 19 (window of 320) are cached. A prompt of
  // 200 tokens sharing the prefix: hits of 12 blocks (192) would need 10,
  // 11; only a hit whose window starts at block 18 or needs only the sink
  // (L <= 46, i.e. 2 blocks) survives.
  const std::vector<int32_t> part(prompt.begin(), prompt.begin() + 200);
  EXPECT_EQ(kv.MatchPrefix(TokenIds{part, {}}, 199).num_positions, 32);
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
}

// Random sequences start (with prefix hits), grow, recycle, cache and end on
// a small pool; after every operation the manager is consistent and no
// sequence lacks a block its window or sink needs.
TEST(KvRecyclingTest, RandomizedNoHoleInsideAWindowOrSink) {
  std::mt19937 rng(1234);
  const int window = 40, sink = 20;  // a sink ending mid-block
  const ModelSpec spec = SlidingSpec(window, sink);
  KvCacheManager kv(spec, 1, kBlock, {600});
  testing::RandomSequences seqs(&kv, &rng, /*footprints=*/false);
  int hits = 0;  // starts that shared a cached prefix
  auto check = [&](const char* after) {
    ASSERT_TRUE(kv.CheckConsistency().ok()) << after << ": " << kv.CheckConsistency().ToString();
    for (const auto& [id, s] : seqs.live()) {
      for (int slot = 0; slot < kv.num_slots(0); ++slot) {
        const std::vector<int32_t>& row = kv.TEST_Row(id, 0, slot);
        const bool sliding = slot % 3 == 0;
        const int64_t live_begin = std::max<int64_t>(0, s.computed - window + 1) / kBlock;
        const int64_t sink_blocks = (sink + kBlock - 1) / kBlock;
        for (int64_t i = 0; i < int64_t(row.size()); ++i) {
          const bool needed = !sliding || i < sink_blocks || i >= live_begin;
          ASSERT_TRUE(!needed || row[size_t(i)] >= 0)
              << after << ": seq " << id << " slot " << slot << " logical " << i
              << " is -1 with " << s.computed << " positions computed";
        }
      }
    }
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = int(rng() % 10);
    if (op < 2 && seqs.size() < 6) {
      // A new sequence sharing a random prefix of an earlier family.
      const int64_t hit = seqs.TryStart();
      if (hit < 0) continue;
      hits += hit > 0;
      check("start");
    } else if (op < 8 && !seqs.empty()) {
      const uint64_t id = seqs.RecycleOne();
      check("recycle");
      if (!seqs.TryAppend(id)) continue;
      check("append");
    } else if (!seqs.empty()) {
      seqs.ReleaseOne();
      check("release");
    }
  }
  seqs.ReleaseAll();
  EXPECT_EQ(kv.Usage(0).num_free, 600);
  EXPECT_GT(kv.num_recycled_blocks(), 0u);
  EXPECT_GT(hits, 10);
  EXPECT_TRUE(kv.CheckConsistency().ok()) << kv.CheckConsistency().ToString();
}

}  // namespace
}  // namespace headway
