#include "coordinator/scheduling/block_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace headway {
namespace {

TEST(BlockPoolTest, AllocatesDistinctIdsAndFreesThem) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_total(), 8);
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_TRUE(pool.CanAllocate(8));
  EXPECT_FALSE(pool.CanAllocate(9));
  std::vector<int32_t> a = pool.Allocate(3);
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  std::vector<int32_t> b = pool.Allocate(5);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_FALSE(pool.CanAllocate(1));
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 8u);
  pool.Free(a);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_allocated(), 5);
  std::vector<int32_t> c = pool.Allocate(3);
  EXPECT_EQ(std::set<int32_t>(c.begin(), c.end()), std::set<int32_t>(a.begin(), a.end()));
}

TEST(BlockPoolTest, ZeroAndEmpty) {
  BlockPool pool(0);
  EXPECT_TRUE(pool.CanAllocate(0));
  EXPECT_FALSE(pool.CanAllocate(1));
  EXPECT_TRUE(pool.Allocate(0).empty());
}

TEST(BlockPoolDeathTest, DoubleFreeAndForeignIdAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        BlockPool pool(4);
        std::vector<int32_t> ids = pool.Allocate(1);
        pool.Free(ids);
        pool.Free(ids);
      },
      "allocated_");
  EXPECT_DEATH(
      {
        BlockPool pool(4);
        pool.Free({7});
      },
      "num_total");
  EXPECT_DEATH(
      {
        BlockPool pool(2);
        (void)pool.Allocate(3);
      },
      "CanAllocate");
}

}  // namespace
}  // namespace headway
