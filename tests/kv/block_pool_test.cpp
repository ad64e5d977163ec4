#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"

namespace serval {
namespace {

TEST(BlockPool, AllocatesDistinctBlocksAndCounts) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_free(), 8);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(3, got));
  ASSERT_TRUE(pool.allocate(2, got));
  EXPECT_EQ(got, (std::vector<BlockId>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_used(), 5);
  for (BlockId id : got) EXPECT_EQ(pool.ref_count(id), 1);
}

TEST(BlockPool, ExhaustionFailsWithoutPartialAllocation) {
  BlockPool pool(4);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(3, got));
  EXPECT_FALSE(pool.allocate(2, got));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_TRUE(pool.allocate(1, got));
  EXPECT_FALSE(pool.allocate(1, got));
  EXPECT_TRUE(pool.allocate(0, got));
}

TEST(BlockPool, RefCountsKeepSharedBlocksUntilLastFree) {
  BlockPool pool(2);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(1, got));
  const BlockId b = got[0];
  pool.incref(b);
  pool.incref(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  EXPECT_FALSE(pool.free(b));
  EXPECT_FALSE(pool.free(b));
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_TRUE(pool.free(b));
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.ref_count(b), 0);
}

TEST(BlockPool, FreedBlocksAreReusedAndAllComeBack) {
  BlockPool pool(5);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(5, got));
  pool.free(got[2]);
  std::vector<BlockId> again;
  ASSERT_TRUE(pool.allocate(1, again));
  EXPECT_EQ(again[0], got[2]);
  for (BlockId id : got) pool.free(id);
  EXPECT_EQ(pool.num_free(), 5);
  std::vector<BlockId> all;
  ASSERT_TRUE(pool.allocate(5, all));
  EXPECT_EQ(std::set<BlockId>(all.begin(), all.end()).size(), 5u);
}

TEST(BlockPool, MisuseThrowsWithMessage) {
  BlockPool pool(3);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(1, got));
  pool.free(got[0]);
  try {
    pool.free(got[0]);
    FAIL() << "double free was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "free: KV block 0 is already free (double free)");
  }
  EXPECT_THROW(pool.free(3), Error);
  EXPECT_THROW(pool.free(-1), Error);
  EXPECT_THROW(pool.incref(1), Error);  // free block
  EXPECT_THROW(pool.incref(7), Error);
  EXPECT_THROW(pool.ref_count(3), Error);
  EXPECT_THROW(BlockPool(-1), Error);
  EXPECT_EQ(pool.num_free(), 3);
}

}  // namespace
}  // namespace serval
