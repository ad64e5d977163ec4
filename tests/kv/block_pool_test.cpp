#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
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

TEST(BlockPool, CachedBlocksStayEvictableUntilUncached) {
  BlockPool pool(3);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(2, got));
  pool.mark_cached(got[0]);
  EXPECT_TRUE(pool.is_cached(got[0]));
  EXPECT_FALSE(pool.is_cached(got[1]));
  EXPECT_TRUE(pool.free(got[0]));  // unreferenced, but kept for reuse
  EXPECT_TRUE(pool.free(got[1]));
  pool.check_invariants();
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_cached_evictable(), 1);
  EXPECT_EQ(pool.num_referenced(), 0);
  // A cache hit revives it; allocation never hands it out.
  EXPECT_TRUE(pool.incref(got[0]));
  EXPECT_FALSE(pool.incref(got[0]));
  EXPECT_EQ(pool.num_cached_evictable(), 0);
  std::vector<BlockId> more;
  EXPECT_FALSE(pool.allocate(3, more));
  ASSERT_TRUE(pool.allocate(2, more));
  EXPECT_EQ(std::count(more.begin(), more.end(), got[0]), 0);
  pool.check_invariants();
  pool.free(got[0]);
  pool.free(got[0]);
  EXPECT_EQ(pool.num_cached_evictable(), 1);
  pool.uncache(got[0]);  // evicted
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_cached_evictable(), 0);
  EXPECT_THROW(pool.incref(got[0]), Error);
  pool.check_invariants();
}

TEST(BlockPool, CacheStateMisuseThrows) {
  BlockPool pool(2);
  EXPECT_THROW(pool.mark_cached(0), Error);  // not referenced
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(1, got));
  EXPECT_THROW(pool.uncache(got[0]), Error);  // not cached
  pool.mark_cached(got[0]);
  EXPECT_THROW(pool.mark_cached(got[0]), Error);
  pool.uncache(got[0]);  // referenced: stays referenced
  EXPECT_EQ(pool.ref_count(got[0]), 1);
  EXPECT_EQ(pool.num_referenced(), 1);
  pool.check_invariants();
}

}  // namespace
}  // namespace serval
