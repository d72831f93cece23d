// The per-slot block arithmetic on its own (block size 16): what a full and
// a sliding slot need, what recycling skips, and the most a slot holds.
#include "coordinator/scheduling/slot_blocks.h"

#include <gtest/gtest.h>

namespace headway {
namespace {

constexpr int kBlockSize = 16;

SlotSpec Sliding(int window, int sink) {
  SlotSpec spec;
  spec.window = window;
  spec.sink = sink;
  return spec;
}

TEST(SlotBlocksTest, LogicalBlocksCoverThePositions) {
  const SlotBlocks blocks(kBlockSize, true);
  EXPECT_EQ(blocks.LogicalBlocks(0), 0);
  EXPECT_EQ(blocks.LogicalBlocks(1), 1);
  EXPECT_EQ(blocks.LogicalBlocks(16), 1);
  EXPECT_EQ(blocks.LogicalBlocks(17), 2);
}

TEST(SlotBlocksTest, AFullSlotNeedsEveryBlock) {
  const SlotBlocks blocks(kBlockSize, true);
  const SlotSpec full;
  EXPECT_EQ(blocks.Unneeded(full, 1000).end, 0);
  EXPECT_EQ(blocks.BlocksToAdd(full, 1, 40, 30), 2);  // logical [1, 3)
  EXPECT_EQ(blocks.BlocksToAdd(full, 3, 40, 30), 0);
  EXPECT_EQ(blocks.PeakBlocks(full, 1000, 16), 63);
}

// Window 32, sink 4: the sink's block 0 and, from the first uncomputed
// position p on, the blocks from floor((p - 31) / 16).
TEST(SlotBlocksTest, ASlidingSlotSkipsWhatLeftEveryWindow) {
  const SlotBlocks blocks(kBlockSize, true);
  const SlotSpec spec = Sliding(32, 4);
  BlockSpan skip = blocks.Unneeded(spec, 100);  // live from floor(69 / 16) = 4
  EXPECT_EQ(skip.begin, 1);
  EXPECT_EQ(skip.end, 4);
  EXPECT_TRUE(skip.Contains(3));
  EXPECT_FALSE(skip.Contains(4));
  EXPECT_EQ(blocks.Unneeded(spec, 40).end, 1);  // nothing left the window yet
  // Logical [0, 7) for 112 positions, less [1, 4).
  EXPECT_EQ(blocks.BlocksToAdd(spec, 0, 112, 100), 4);
  EXPECT_EQ(blocks.BlocksToAdd(spec, 5, 112, 100), 2);
}

// Chunks of 16 over window 32: at most the sink block and
// ceil((31 + 16 + 15) / 16) = 4 window blocks (p = 49 holds blocks 0..4).
TEST(SlotBlocksTest, PeakBlocksBoundARecyclingSlot) {
  const SlotBlocks blocks(kBlockSize, true);
  const SlotSpec spec = Sliding(32, 4);
  EXPECT_EQ(blocks.PeakBlocks(spec, 1000, 16), 5);
  EXPECT_EQ(blocks.PeakBlocks(spec, 20, 16), 2);  // shorter than the bound
}

TEST(SlotBlocksTest, WithoutRecyclingASlidingSlotIsFull) {
  const SlotBlocks blocks(kBlockSize, false);
  const SlotSpec spec = Sliding(32, 4);
  EXPECT_EQ(blocks.Unneeded(spec, 100).end, 0);
  EXPECT_EQ(blocks.BlocksToAdd(spec, 0, 112, 100), 7);
  EXPECT_EQ(blocks.PeakBlocks(spec, 1000, 16), 63);
}

TEST(SlotBlocksTest, RetainedSpanIsThePromptsLastWindowPlusAGapBlock) {
  const SlotBlocks blocks(kBlockSize, true);
  const SlotSpec spec = Sliding(512, 0);
  // Committed 1,200 -> 75 blocks (1,200 = 75 x 16): matches of 74 or 75
  // blocks need the windows of positions 1,184 and 1,200, from block 42.
  const BlockSpan span = blocks.RetainedSpan(spec, 1200);
  EXPECT_EQ(span.begin, 42);
  EXPECT_EQ(span.end, 75);
  EXPECT_EQ(blocks.RetainedSpan(spec, 1215).end, 75);  // a partial block is not committed
  EXPECT_EQ(blocks.RetainedSpan(spec, 100).begin, 0);  // shorter than the window: all of it
  EXPECT_EQ(blocks.RetainedSpan(Sliding(512, 40), 1200).begin, 42);  // the sink is apart
  EXPECT_EQ(blocks.RetainedSpan(SlotSpec{}, 1200).end, 0);           // full slots: nothing
  EXPECT_EQ(SlotBlocks(kBlockSize, false).RetainedSpan(spec, 1200).end, 0);
}

TEST(SlotBlocksTest, FootprintPlusOneChunkCoversThePrefillPeak) {
  // Admission reserves FootprintBlocks per request and ChunkExtraBlocks
  // once; together they bound what one sequence holds while it prefills.
  for (int block_size : {1, 4, 16, 64}) {
    const SlotBlocks blocks(block_size, true);
    for (const SlotSpec& spec : {Sliding(32, 0), Sliding(100, 7), Sliding(512, 0), SlotSpec{}}) {
      for (int chunk : {1, 5, 64, 512}) {
        for (int64_t len : {1, 31, 200, 5000}) {
          EXPECT_GE(blocks.FootprintBlocks(spec, len, false, len) +
                        blocks.ChunkExtraBlocks(spec, chunk),
                    blocks.PeakBlocks(spec, len, chunk))
              << "block " << block_size << " window " << spec.window << " chunk " << chunk
              << " len " << len;
          // Retention adds at most the retained span.
          EXPECT_LE(blocks.FootprintBlocks(spec, len, true, len) -
                        blocks.FootprintBlocks(spec, len, false, len),
                    blocks.RetainedSpan(spec, 1 << 20).end - blocks.RetainedSpan(spec, 1 << 20).begin);
        }
      }
    }
  }
}

}  // namespace
}  // namespace headway
