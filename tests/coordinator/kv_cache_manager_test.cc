#include "coordinator/scheduling/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeLlamaSpec;

TEST(KvCacheManagerTest, SlotsFollowTheShard) {
  ModelSpec spec = FakeLlamaSpec(2);
  KvCacheManager tp1(spec, 1, 16, {100});
  EXPECT_EQ(tp1.num_slots(0), 2 * 3);
  KvCacheManager tp3(spec, 3, 16, {100, 100, 100});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(tp3.num_slots(r), 2);
}

TEST(KvCacheManagerTest, AppendGivesDeltasPerSlot) {
  ModelSpec spec = FakeLlamaSpec(2);
  KvCacheManager kv(spec, 1, 4, {100});
  const int slots = kv.num_slots(0);
  EXPECT_EQ(kv.BlocksNeeded(0, 7, 5), 2 * slots);
  ASSERT_TRUE(kv.CanAppend(7, 5));
  auto deltas = kv.Append(7, 5);  // positions [0, 5): 2 blocks per slot
  ASSERT_EQ(deltas.size(), 1u);
  ASSERT_EQ(int(deltas[0].size()), slots);
  std::set<int32_t> seen;
  for (int s = 0; s < slots; ++s) {
    EXPECT_EQ(deltas[0][s].slot, s);
    EXPECT_EQ(deltas[0][s].first_logical, 0);
    ASSERT_EQ(deltas[0][s].appended.size(), 2u);
    EXPECT_EQ(kv.TEST_Row(7, 0, s), deltas[0][s].appended);
    seen.insert(deltas[0][s].appended.begin(), deltas[0][s].appended.end());
  }
  EXPECT_EQ(int(seen.size()), 2 * slots);  // no block shared between slots
  EXPECT_EQ(kv.Usage(0).num_free, 100 - 2 * slots);

  // Within the last block: nothing to add.
  EXPECT_EQ(kv.BlocksNeeded(0, 7, 8), 0);
  auto none = kv.Append(7, 8);
  EXPECT_TRUE(none[0].empty());
  // Crossing into logical block 2: one block per slot from first_logical 2.
  auto more = kv.Append(7, 9);
  ASSERT_EQ(int(more[0].size()), slots);
  for (const SlotBlockDelta& d : more[0]) {
    EXPECT_EQ(d.first_logical, 2);
    EXPECT_EQ(d.appended.size(), 1u);
    EXPECT_EQ(kv.TEST_Row(7, 0, d.slot).size(), 3u);
    EXPECT_EQ(kv.TEST_Row(7, 0, d.slot)[2], d.appended[0]);
  }
  EXPECT_EQ(kv.NumCoveredPositions(7), 9);
}

TEST(KvCacheManagerTest, ReleaseReturnsEveryBlock) {
  ModelSpec spec = FakeLlamaSpec(2);
  KvCacheManager kv(spec, 3, 4, {50, 50, 50});
  ASSERT_TRUE(kv.CanAppend(1, 10));
  auto deltas = kv.Append(1, 10);
  ASSERT_EQ(deltas.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    // 2 slots per rank, 3 blocks each.
    EXPECT_EQ(kv.Usage(r).num_free, 50 - 6);
    EXPECT_EQ(deltas[r].size(), 2u);
  }
  kv.Release(1);
  kv.Release(1);  // unknown now: no-op
  for (int r = 0; r < 3; ++r) EXPECT_EQ(kv.Usage(r).num_free, 50);
  EXPECT_FALSE(kv.Contains(1));
}

TEST(KvCacheManagerTest, NoPartialAllocationWhenOneRankIsShort) {
  ModelSpec spec = FakeLlamaSpec(2);
  // Rank 2 has fewer blocks than the others.
  KvCacheManager kv(spec, 3, 4, {50, 50, 5});
  EXPECT_FALSE(kv.CanAppend(1, 16));  // 4 blocks x 2 slots = 8 > 5 on rank 2
  EXPECT_TRUE(kv.CanAppend(1, 8));    // 2 x 2 = 4
  for (int r = 0; r < 3; ++r) EXPECT_EQ(kv.Usage(r).num_free, r == 2 ? 5 : 50);
  EXPECT_FALSE(kv.Contains(1));
  EXPECT_EQ(kv.MaxPositionsPerSequence(/*max_chunk_tokens=*/512), (5 / 2) * 4);
}

TEST(KvCacheManagerTest, ReplicatedKvHeadsTakeBlocksOnEveryReplica) {
  ModelSpec spec = FakeLlamaSpec(2);
  spec.num_kv_heads = 1;
  spec.slot_specs.assign(2, SlotSpec{});
  ASSERT_TRUE(ValidateTpSize(spec, 3).ok());
  KvCacheManager kv(spec, 3, 4, {20, 20, 20});
  auto deltas = kv.Append(1, 4);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(kv.num_slots(r), 2);  // 2 layers x 1 (replicated) KV head
    EXPECT_EQ(kv.Usage(r).num_free, 18);
  }
}

TEST(KvCacheManagerDeathTest, AppendWithoutRoomAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        KvCacheManager kv(FakeLlamaSpec(2), 1, 4, {3});
        (void)kv.Append(1, 4);
      },
      "CanAppend");
}

}  // namespace
}  // namespace headway

namespace headway {
namespace {

// The transfer verbs: a pin holds a cached prefix for sending, a
// reservation the blocks a receiver lacks; both count in Usage and
// CheckConsistency, and pins, reservations and sequences have separate ids.
TEST(KvCacheManagerTest, PinsAndReservationsHoldBlocksOutsideSequences) {
  ModelSpec spec = testing::FakeLlamaSpec(2);
  const int slots = 2 * 3;
  std::vector<int32_t> tokens(12);
  for (int i = 0; i < 12; ++i) tokens[size_t(i)] = 50 + i;
  const TokenIds prompt{tokens, {}};

  KvCacheManager sender(spec, 1, 4, {64});
  ASSERT_TRUE(sender.CanAppend(1, 8));
  (void)sender.Append(1, 8);
  sender.CacheComputedBlocks(1, prompt, 8);
  sender.Release(1);  // the two cached blocks are evictable now
  PrefixMatch cached = sender.MatchPrefix(prompt, 8);
  ASSERT_EQ(cached.num_positions, 8);
  ASSERT_TRUE(sender.CanPin(cached));
  const PinId pin = sender.Pin(cached);
  EXPECT_EQ(sender.Usage(0).num_referenced, 2 * slots);
  EXPECT_EQ(sender.Rows(pin, 0).size(), size_t(slots));
  EXPECT_EQ(sender.num_sequences(), 0u);  // a pin is not a sequence
  EXPECT_FALSE(sender.Contains(uint64_t(pin.value)));
  EXPECT_TRUE(sender.CheckConsistency().ok()) << sender.CheckConsistency().message();
  sender.Unpin(pin);
  EXPECT_EQ(sender.Usage(0).num_referenced, 0);
  EXPECT_EQ(sender.Usage(0).num_evictable, 2 * slots);
  EXPECT_TRUE(sender.CheckConsistency().ok());

  KvCacheManager receiver(spec, 1, 4, {64});
  PrefixMatch none = receiver.MatchPrefix(prompt, 8);
  ASSERT_TRUE(receiver.CanReserve(none, 8));
  const ReservationId reservation = receiver.Reserve(none, 8);
  EXPECT_TRUE(receiver.Contains(reservation));
  EXPECT_EQ(receiver.Usage(0).num_referenced, 2 * slots);
  EXPECT_TRUE(receiver.CheckConsistency().ok()) << receiver.CheckConsistency().message();
  receiver.CommitReceived(reservation, prompt, 8);
  EXPECT_FALSE(receiver.Contains(reservation));
  EXPECT_EQ(receiver.MatchPrefix(prompt, 11).num_positions, 8);  // received = cached
  EXPECT_EQ(receiver.Usage(0).num_referenced, 0);
  EXPECT_TRUE(receiver.CheckConsistency().ok());

  // A cancelled reservation caches nothing.
  KvCacheManager failed(spec, 1, 4, {64});
  const ReservationId r2 = failed.Reserve(failed.MatchPrefix(prompt, 8), 8);
  failed.CancelReservation(r2);
  EXPECT_EQ(failed.MatchPrefix(prompt, 11).num_positions, 0);
  EXPECT_EQ(failed.Usage(0).num_free, 64);
  EXPECT_TRUE(failed.CheckConsistency().ok());
}

}  // namespace
}  // namespace headway
