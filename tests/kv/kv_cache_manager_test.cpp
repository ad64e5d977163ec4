#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace serval {
namespace {

TEST(BlockTable, AppendCrossesBlockBoundaries) {
  BlockPool pool(10);
  BlockTable table(4);
  auto s1 = table.append_slots(pool, 3);
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(*s1, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(table.num_blocks(), 1);
  auto s2 = table.append_slots(pool, 6);  // fills block 0, all of block 1, 1 of block 2
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(*s2, (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(table.blocks(), (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(table.num_tokens(), 9);
  EXPECT_EQ(table.blocks_needed(3), 0);
  EXPECT_EQ(table.blocks_needed(4), 1);
  for (int64_t p = 0; p < 9; ++p) EXPECT_EQ(table.slot(p), p);
  EXPECT_THROW(table.slot(9), Error);
}

TEST(BlockTable, SlotsFollowNonContiguousBlocks) {
  BlockPool pool(6);
  BlockTable a(2), b(2);
  ASSERT_TRUE(a.append_slots(pool, 2));  // block 0
  ASSERT_TRUE(b.append_slots(pool, 2));  // block 1
  auto more = a.append_slots(pool, 3);   // blocks 2, 3
  ASSERT_TRUE(more.has_value());
  EXPECT_EQ(*more, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(a.blocks(), (std::vector<BlockId>{0, 2, 3}));
  EXPECT_EQ(a.slot(1), 1);
  EXPECT_EQ(a.slot(2), 4);
  EXPECT_EQ(b.slot(1), 3);
}

TEST(KvCacheManager, ExhaustionReportsFailureWithoutPartialAllocation) {
  KvCacheManager kv(3, 4);
  BlockTable t = kv.new_table();
  ASSERT_TRUE(kv.allocate_slots(t, 5));  // 2 blocks
  EXPECT_TRUE(kv.can_allocate(t, 7));    // 3 in block 1 + 4 in a new one
  EXPECT_FALSE(kv.can_allocate(t, 8));
  EXPECT_FALSE(kv.allocate_slots(t, 8).has_value());
  EXPECT_EQ(t.num_tokens(), 5);
  EXPECT_EQ(t.num_blocks(), 2);
  EXPECT_EQ(kv.usage().free_blocks, 1);
  ASSERT_TRUE(kv.allocate_slots(t, 7));
  EXPECT_EQ(kv.usage().free_blocks, 0);
  EXPECT_DOUBLE_EQ(kv.usage().fraction_used(), 1.0);
}

TEST(KvCacheManager, FreeReturnsEverything) {
  KvCacheManager kv(8, 16);
  std::vector<BlockTable> tables(3, kv.new_table());
  ASSERT_TRUE(kv.allocate_slots(tables[0], 40));
  ASSERT_TRUE(kv.allocate_slots(tables[1], 1));
  ASSERT_TRUE(kv.allocate_slots(tables[2], 16));
  ASSERT_TRUE(kv.allocate_slots(tables[1], 16));
  EXPECT_EQ(kv.usage().used_blocks, 3 + 2 + 1);
  for (auto& t : tables) kv.free(t);
  const KvUsage u = kv.usage();
  EXPECT_EQ(u.free_blocks, 8);
  EXPECT_EQ(u.used_blocks, 0);
  EXPECT_EQ(u.capacity_tokens(), 128);
  EXPECT_EQ(tables[0].num_tokens(), 0);
  EXPECT_TRUE(tables[0].blocks().empty());
}

TEST(KvCacheManager, RejectsTablesOfAnotherBlockSize) {
  KvCacheManager kv(4, 16);
  BlockTable t(8);
  EXPECT_THROW((void)kv.allocate_slots(t, 1), Error);
  EXPECT_THROW(KvCacheManager(4, 0), Error);
}

}  // namespace
}  // namespace serval
