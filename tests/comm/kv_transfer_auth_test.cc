// KV write authorization (comm/kv_write_auth.h): grants and their tags, the
// receiver's transfer window, and rogue agents that write into a receiver
// without a grant, with a forged one, outside the blocks of a real one and
// with an expired one: each is refused, the receiver's pool keeps its bytes
// and a legitimate transfer still lands afterwards.
#include "comm/kv_write_auth.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/kv_transfer.h"
#include "tests/comm/kv_write_grant.h"
#include "tests/comm/transport_name.h"

namespace headway {
namespace {

using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kBlockBytes = 4096;
constexpr uint32_t kNumBlocks = 32;
constexpr Millis kTimeout(10000);

std::string Key(char fill) { return std::string(kKvWriteKeyBytes, fill); }

std::vector<uint8_t> MakePool(uint8_t seed) {
  std::vector<uint8_t> pool(kBlockBytes * kNumBlocks);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = uint8_t(i * 13 + i / 4093 + seed);
  return pool;
}

// ---- grants and the window, without UCX

TEST(KvWriteGrantTest, OneRangePerRunOfConsecutiveDestinations) {
  auto grant = GrantKvWrites(Key('a'), 9, 1000, {4, 5, 6, 9, 3, 4, 20});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->transfer_id, 9u);
  EXPECT_EQ(grant->lifetime_ms, 1000u);
  ASSERT_EQ(grant->ranges.size(), 4u);
  const std::vector<std::pair<uint32_t, uint32_t>> want = {{4, 3}, {9, 1}, {3, 2}, {20, 1}};
  for (size_t i = 0; i < want.size(); ++i) {
    const KvWriteRange& r = grant->ranges[i];
    EXPECT_EQ(r.first_block, want[i].first);
    EXPECT_EQ(r.num_blocks, want[i].second);
    EXPECT_TRUE(VerifyKvWriteRange(Key('a'), 9, 1000, r.first_block, r.num_blocks, r.tag));
  }
  EXPECT_TRUE(GrantKvWrites(Key('a'), 9, 1000, {})->ranges.empty());
}

TEST(KvWriteGrantTest, ATagVerifiesOnlyForItsKeyAndFields) {
  const KvWriteTag tag = KvWriteRangeTag(Key('a'), 7, 500, 10, 4);
  EXPECT_TRUE(VerifyKvWriteRange(Key('a'), 7, 500, 10, 4, tag));
  EXPECT_FALSE(VerifyKvWriteRange(Key('b'), 7, 500, 10, 4, tag));  // another receiver
  EXPECT_FALSE(VerifyKvWriteRange(Key('a'), 8, 500, 10, 4, tag));  // another transfer
  EXPECT_FALSE(VerifyKvWriteRange(Key('a'), 7, 501, 10, 4, tag));  // a longer life
  EXPECT_FALSE(VerifyKvWriteRange(Key('a'), 7, 500, 11, 4, tag));  // other blocks
  EXPECT_FALSE(VerifyKvWriteRange(Key('a'), 7, 500, 10, 5, tag));  // more blocks
  EXPECT_FALSE(VerifyKvWriteRange(Key('a'), 7, 500, 10, 4, KvWriteTag{}));
  EXPECT_FALSE(VerifyKvWriteRange("short", 7, 500, 10, 4, tag));
}

TEST(KvWriteGrantTest, BadKeysAndLifetimesAreRefused) {
  EXPECT_EQ(GrantKvWrites("", 1, 1000, {1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GrantKvWrites(Key('a') + "x", 1, 1000, {1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(GrantKvWrites(Key('a'), 1, 0, {1}).status().code(), StatusCode::kInvalidArgument);
}

TEST(KvWriteGrantTest, NewKeysAreRandom) {
  auto a = NewKvWriteKey(), b = NewKvWriteKey();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kKvWriteKeyBytes);
  EXPECT_NE(*a, *b);
}

TEST(KvTransferWindowTest, AdmitsATransferForItsLifetimeThenRefusesItAndOlderIds) {
  KvTransferWindow window;
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(window.Admit(5, 100, t0));
  EXPECT_TRUE(window.Admit(5, 100, t0 + Millis(99)));  // more messages of it
  EXPECT_TRUE(window.Admit(3, 100, t0 + Millis(50)));  // concurrent transfers
  EXPECT_TRUE(window.Admit(8, 100, t0 + Millis(60)));  // arrive in any order
  EXPECT_EQ(window.size(), 3u);
  // 5's lifetime (from its first message) has passed: 5, and 4, never seen,
  // are refused; 3 expired too; 8 is still live.
  EXPECT_FALSE(window.Admit(5, 100, t0 + Millis(100)));
  EXPECT_FALSE(window.Admit(4, 100, t0 + Millis(100)));
  EXPECT_FALSE(window.Admit(3, 100, t0 + Millis(100)));
  EXPECT_TRUE(window.Admit(8, 100, t0 + Millis(150)));
  EXPECT_TRUE(window.Admit(6, 100, t0 + Millis(150)));  // above the floor: new
  EXPECT_FALSE(window.Admit(8, 100, t0 + Millis(160)));
  EXPECT_FALSE(window.Admit(7, 100, t0 + Millis(160)));
  EXPECT_TRUE(window.Admit(9, 100, t0 + Millis(160)));
  // Only live transfers are remembered.
  EXPECT_EQ(window.size(), 2u);
  EXPECT_FALSE(window.Admit(9, 100, t0 + Millis(10000)));
  EXPECT_EQ(window.size(), 0u);
}

// ---- rogue agents against a receiver

class KvTransferAuthTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dst_ = MakePool(2);
    legit_pool_ = MakePool(1);
    rogue_pool_ = MakePool(3);
    receiver_ = MakeAgent(dst_, false);
    legit_ = MakeAgent(legit_pool_, false);
    rogue_ = MakeAgent(rogue_pool_, false);
    liar_ = MakeAgent(rogue_pool_, true);
    ASSERT_TRUE(receiver_ && legit_ && rogue_ && liar_);
    for (KvTransferAgent* sender : {legit_.get(), rogue_.get(), liar_.get()}) {
      auto peer = sender->Connect(receiver_->local_info());
      ASSERT_TRUE(peer.ok()) << peer.status().ToString();
      peers_.push_back(*peer);
    }
  }

  std::unique_ptr<KvTransferAgent> MakeAgent(std::vector<uint8_t>& pool, bool liar) {
    KvTransferOptions options;
    options.transports = GetParam();
    options.TEST_label_all_with_first_range = liar;
    auto agent = KvTransferAgent::Create(pool.data(), kBlockBytes, kNumBlocks, options);
    EXPECT_TRUE(agent.ok()) << agent.status().ToString();
    return agent.ok() ? std::move(agent).value() : nullptr;
  }

  // The rogue's write of `copies` under `grant` is refused by the receiver,
  // which counts it and keeps every byte of its pool.
  void ExpectRefused(KvTransferAgent* sender, int peer, const std::vector<BlockCopy>& copies,
                     const KvWriteGrant& grant) {
    const std::vector<uint8_t> before = dst_;
    const uint64_t refused = receiver_->refused_messages();
    Status st = sender->WriteBlocks(peer, copies, grant, kTimeout);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find("receiver refused"), std::string::npos) << st.ToString();
    EXPECT_GT(receiver_->refused_messages(), refused);
    EXPECT_TRUE(dst_ == before) << "the receiver's pool changed";
  }

  // A legitimate transfer still lands: the legit sender's blocks, exactly.
  void ExpectLegitimateWriteLands() {
    const std::vector<BlockCopy> copies = {{0, 8}, {1, 9}, {2, 10}, {20, 30}};
    std::vector<uint8_t> want = dst_;
    for (const BlockCopy& c : copies) {
      std::memcpy(&want[c.dst * kBlockBytes], &legit_pool_[c.src * kBlockBytes], kBlockBytes);
    }
    Status st = legit_->WriteBlocks(peers_[0], copies,
                                    testing::Grant(receiver_->write_key(), copies), kTimeout);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(dst_ == want);
  }

  std::vector<uint8_t> dst_, legit_pool_, rogue_pool_;
  std::unique_ptr<KvTransferAgent> receiver_, legit_, rogue_, liar_;
  std::vector<int> peers_;  // legit_, rogue_, liar_ connected to receiver_
};

TEST_P(KvTransferAuthTest, AWriteWithoutAGrantIsRefused) {
  // No grant at all: a sender cannot even name the blocks (nothing is sent).
  const std::vector<BlockCopy> copies = {{0, 8}, {1, 9}};
  const uint64_t refused = receiver_->refused_messages();
  EXPECT_EQ(rogue_->WriteBlocks(peers_[1], copies, KvWriteGrant{}, kTimeout).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver_->refused_messages(), refused);
  // Ranges with no tag (zeros) reach the receiver, which refuses them.
  KvWriteGrant untagged;
  untagged.transfer_id = testing::NextTestTransferId();
  untagged.lifetime_ms = 60000;
  untagged.ranges.push_back(KvWriteRange{8, 2, KvWriteTag{}});
  ExpectRefused(rogue_.get(), peers_[1], copies, untagged);
  ExpectLegitimateWriteLands();
}

TEST_P(KvTransferAuthTest, AGrantMadeWithAnotherKeyIsRefused) {
  const std::vector<BlockCopy> copies = {{0, 8}, {1, 9}, {5, 0}, {31, 31}};
  auto guessed = NewKvWriteKey();  // the rogue's best guess at the receiver's key
  ASSERT_TRUE(guessed.ok());
  ExpectRefused(rogue_.get(), peers_[1], copies, testing::Grant(*guessed, copies));
  // A grant for another receiver (another key) is as useless.
  ExpectRefused(rogue_.get(), peers_[1], copies, testing::Grant(legit_->write_key(), copies));
  ExpectLegitimateWriteLands();
}

TEST_P(KvTransferAuthTest, AValidGrantDoesNotReachOtherBlocks) {
  // A real grant, for blocks 8..9 of this receiver, taken by the rogue.
  const KvWriteGrant stolen = testing::Grant(receiver_->write_key(), {{0, 8}, {1, 9}});
  const std::vector<BlockCopy> elsewhere = {{0, 12}, {1, 13}};
  // An honest agent will not send what its grant does not cover.
  const std::vector<uint8_t> before = dst_;
  EXPECT_EQ(rogue_->WriteBlocks(peers_[1], elsewhere, stolen, kTimeout).code(),
            StatusCode::kFailedPrecondition);
  // One that labels the messages with the stolen range is refused by the
  // receiver: its bytes lie outside the range the tag covers.
  ExpectRefused(liar_.get(), peers_[2], elsewhere, stolen);
  // Moving the range to the blocks it wants breaks the tag.
  KvWriteGrant moved = stolen;
  moved.ranges[0].first_block = 12;
  ExpectRefused(rogue_.get(), peers_[1], elsewhere, moved);
  // A range grown past its blocks, too.
  KvWriteGrant grown = stolen;
  grown.ranges[0].num_blocks = 6;
  ExpectRefused(rogue_.get(), peers_[1], {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}}, grown);
  EXPECT_TRUE(dst_ == before);
  ExpectLegitimateWriteLands();
}

TEST_P(KvTransferAuthTest, AnExpiredGrantIsNotReplayed) {
  // A legitimate transfer with a short lifetime...
  const std::vector<BlockCopy> copies = {{4, 16}, {5, 17}};
  const KvWriteGrant grant = testing::Grant(receiver_->write_key(), copies, 1000);
  ASSERT_TRUE(legit_->WriteBlocks(peers_[0], copies, grant, kTimeout).ok());
  // ...whose grant, replayed once that lifetime has passed, writes nothing,
  // from the rogue or from the legitimate sender itself.
  std::this_thread::sleep_for(Millis(1100));
  ExpectRefused(rogue_.get(), peers_[1], copies, grant);
  ExpectRefused(legit_.get(), peers_[0], copies, grant);
  ExpectLegitimateWriteLands();
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferAuthTest, ::testing::Values("tcp", "sm,self"),
                         testing::TransportName);

}  // namespace
}  // namespace headway
