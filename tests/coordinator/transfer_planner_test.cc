#include "coordinator/engine/transfer_planner.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeLlamaSpec;
using Tables = std::vector<RankRows>;

// Block id of (rank, slot, logical) in a table built by MakeTables: distinct
// per side so a test can tell which block went where.
int32_t BlockId(int side, int rank, int slot, int logical) {
  return side * 100000 + rank * 1000 + slot * 10 + logical;
}

// Every rank's rows of an instance of `tp_size`: each slot holds
// `num_blocks` blocks from logical 0.
Tables MakeTables(const ModelSpec& spec, int tp_size, int num_blocks, int side) {
  Tables tables(static_cast<size_t>(tp_size));
  const int local = ShardForRank(spec, tp_size, 0).num_local_kv_heads();
  for (int r = 0; r < tp_size; ++r) {
    for (int slot = 0; slot < spec.num_layers * local; ++slot) {
      std::vector<int32_t> row;
      for (int b = 0; b < num_blocks; ++b) row.push_back(BlockId(side, r, slot, b));
      tables[size_t(r)].push_back(row);
    }
  }
  return tables;
}

ModelSpec OneKvHeadSpec() {
  ModelSpec spec = FakeLlamaSpec();
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.hidden_size = 256;
  spec.slot_specs.assign(size_t(spec.num_layers), SlotSpec{});
  return spec;
}

TEST(TransferPlannerTest, Tp1ToTp3SendsEachHeadToItsRank) {
  const ModelSpec spec = FakeLlamaSpec(2);  // 3 KV heads
  auto plan = PlanBlockCopies(spec, 1, MakeTables(spec, 1, 3, 0), 3, MakeTables(spec, 3, 3, 1),
                              /*first_new_block=*/1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 3u);
  for (int rd = 0; rd < 3; ++rd) {
    const RankBlockCopies& c = (*plan)[size_t(rd)];
    EXPECT_EQ(c.src_rank, 0);
    EXPECT_EQ(c.dst_rank, rd);
    // 2 layers x logical blocks 1 and 2; decode rank rd holds head rd only.
    ASSERT_EQ(c.src_blocks.size(), 4u);
    ASSERT_EQ(c.dst_blocks.size(), 4u);
    size_t i = 0;
    for (int layer = 0; layer < 2; ++layer) {
      for (int b = 1; b < 3; ++b, ++i) {
        EXPECT_EQ(c.src_blocks[i], uint32_t(BlockId(0, 0, layer * 3 + rd, b)));
        EXPECT_EQ(c.dst_blocks[i], uint32_t(BlockId(1, rd, layer, b)));
      }
    }
  }
}

TEST(TransferPlannerTest, Tp3ToTp1GathersEveryRank) {
  const ModelSpec spec = FakeLlamaSpec(2);
  auto plan = PlanBlockCopies(spec, 3, MakeTables(spec, 3, 2, 0), 1, MakeTables(spec, 1, 2, 1), 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 3u);
  for (int rs = 0; rs < 3; ++rs) {
    const RankBlockCopies& c = (*plan)[size_t(rs)];
    EXPECT_EQ(c.src_rank, rs);
    EXPECT_EQ(c.dst_rank, 0);
    ASSERT_EQ(c.src_blocks.size(), 4u);  // 2 layers x 2 blocks of head rs
    EXPECT_EQ(c.src_blocks[0], uint32_t(BlockId(0, rs, 0, 0)));
    EXPECT_EQ(c.dst_blocks[0], uint32_t(BlockId(1, 0, rs, 0)));
    EXPECT_EQ(c.src_blocks[3], uint32_t(BlockId(0, rs, 1, 1)));
    EXPECT_EQ(c.dst_blocks[3], uint32_t(BlockId(1, 0, 3 + rs, 1)));
  }
}

TEST(TransferPlannerTest, ReplicatedHeadIsSentOncePerDestination) {
  const ModelSpec spec = OneKvHeadSpec();
  // Prefill TP 2 holds the one head twice; only rank 0 sends, to both
  // decode replicas.
  auto plan = PlanBlockCopies(spec, 2, MakeTables(spec, 2, 2, 0), 2, MakeTables(spec, 2, 2, 1), 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].src_rank, 0);
  EXPECT_EQ((*plan)[0].dst_rank, 0);
  EXPECT_EQ((*plan)[1].src_rank, 0);
  EXPECT_EQ((*plan)[1].dst_rank, 1);
  for (const RankBlockCopies& c : *plan) EXPECT_EQ(c.src_blocks.size(), 4u);  // 2 layers x 2
}

TEST(TransferPlannerTest, NothingNewMeansNoCopies) {
  const ModelSpec spec = FakeLlamaSpec(2);
  auto plan = PlanBlockCopies(spec, 1, MakeTables(spec, 1, 2, 0), 3, MakeTables(spec, 3, 2, 1), 2);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->empty());
}

// A sliding slot's -1 entries (outside its window and sink) move nothing;
// the prefill side may lack them too.
TEST(TransferPlannerTest, RecycledEntriesAreSkipped) {
  const ModelSpec spec = FakeLlamaSpec(1);
  Tables src = MakeTables(spec, 1, 4, 0);
  Tables dst = MakeTables(spec, 1, 4, 1);
  src[0][1][1] = -1;  // slot 1: logical 1 recycled on both sides
  dst[0][1][1] = -1;
  dst[0][2][2] = -1;  // slot 2: the decode side does not want logical 2
  auto plan = PlanBlockCopies(spec, 1, src, 1, dst, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].src_blocks.size(), 3u * 4 - 2);
  for (uint32_t b : (*plan)[0].src_blocks) {
    EXPECT_NE(b, uint32_t(BlockId(0, 0, 1, 1)));
    EXPECT_NE(b, uint32_t(BlockId(0, 0, 2, 2)));
  }
  // The prefill side lacking a wanted block is an error.
  src[0][0][3] = -1;
  EXPECT_FALSE(PlanBlockCopies(spec, 1, src, 1, dst, 0).ok());
}

TEST(TransferPlannerTest, MismatchedTablesAreRefused) {
  const ModelSpec spec = FakeLlamaSpec(2);
  // The decode side covers more blocks than the prefill side computed.
  auto longer = PlanBlockCopies(spec, 1, MakeTables(spec, 1, 2, 0), 1, MakeTables(spec, 1, 3, 1), 0);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("wants logical block 2"), std::string::npos)
      << longer.status().message();
  // Rank tables that do not match the TP size.
  auto ranks = PlanBlockCopies(spec, 3, MakeTables(spec, 1, 2, 0), 1, MakeTables(spec, 1, 2, 1), 0);
  EXPECT_FALSE(ranks.ok());
  // A TP size the model cannot shard.
  auto tp = PlanBlockCopies(spec, 2, Tables(2), 1, MakeTables(spec, 1, 2, 1), 0);
  EXPECT_FALSE(tp.ok());
}

TEST(TransferPlannerTest, TwoKvCacheDtypesTravelInOneListPerClass) {
  // Layer 0 slides (sliding dtype q8_0), layer 1 is full (float32): each
  // rank pair gets the full slots' blocks as class 0 and the sliding slots'
  // as class 1, whose ids address the arena in their own block size.
  ModelSpec spec = FakeLlamaSpec(2);
  for (int h = 0; h < spec.num_kv_heads; ++h) spec.slot_specs[size_t(h)].window = 64;
  const KvCacheDtypes dtypes{KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0};
  auto plan = PlanBlockCopies(spec, 1, MakeTables(spec, 1, 2, 0), 1, MakeTables(spec, 1, 2, 1),
                              /*first_new_block=*/0, dtypes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].block_class, 0);
  EXPECT_EQ((*plan)[1].block_class, 1);
  // Slots 3..5 (layer 1) are full, slots 0..2 slide; two blocks each.
  EXPECT_EQ((*plan)[0].src_blocks.front(), uint32_t(BlockId(0, 0, 3, 0)));
  EXPECT_EQ((*plan)[1].src_blocks.front(), uint32_t(BlockId(0, 0, 0, 0)));
  EXPECT_EQ((*plan)[0].dst_blocks.size(), 6u);
  EXPECT_EQ((*plan)[1].dst_blocks.size(), 6u);
  // One dtype: one list, class 0, as before.
  auto same = PlanBlockCopies(spec, 1, MakeTables(spec, 1, 2, 0), 1, MakeTables(spec, 1, 2, 1), 0);
  ASSERT_TRUE(same.ok());
  ASSERT_EQ(same->size(), 1u);
  EXPECT_EQ((*same)[0].block_class, 0);
}

}  // namespace
}  // namespace headway
