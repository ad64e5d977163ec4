#include "engine/batch_builder.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/kv_cache_manager.h"

namespace serval {
namespace {

Sequence make_seq(int64_t id, std::vector<int32_t> prompt, KvCacheManager& kv) {
  SamplingParams p;
  p.seed = 1;
  return Sequence(id, std::move(prompt), p, StopCriteria{}, kv.new_table());
}

TEST(BatchBuilder, MixesPrefillChunksAndDecodes) {
  KvCacheManager kv(16, 4);
  Sequence a = make_seq(0, {10, 11, 12, 13, 14, 15}, kv);  // prefill, 6 tokens
  Sequence b = make_seq(1, {20, 21, 22}, kv);              // decode after its prompt
  Sequence c = make_seq(2, {30, 31, 32, 33, 34, 35, 36}, kv);  // chunk 2 of a prompt
  ASSERT_TRUE(kv.allocate_slots(b.block_table(), 3));
  b.advance_computed(3);
  b.append_output(23, std::nullopt, 0);
  ASSERT_TRUE(kv.allocate_slots(c.block_table(), 3));
  c.advance_computed(3);
  ASSERT_TRUE(kv.allocate_slots(a.block_table(), 6));      // blocks 2, 3
  ASSERT_TRUE(kv.allocate_slots(b.block_table(), 1));      // still block 0
  ASSERT_TRUE(kv.allocate_slots(c.block_table(), 3));      // c: blocks 1, 4

  const std::vector<ScheduledChunk> items = {{&a, 6}, {&b, 1}, {&c, 3}};
  const Batch batch = BatchBuilder(4).build(items);
  EXPECT_EQ(batch.token_ids, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 23, 33, 34, 35}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 3, 3, 4, 5}));
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0, 6, 7, 10}));
  EXPECT_EQ(batch.context_len, (std::vector<int32_t>{6, 4, 6}));
  EXPECT_EQ(batch.max_blocks_per_seq, 2);
  EXPECT_EQ(a.block_table().blocks(), (std::vector<BlockId>{2, 3}));
  EXPECT_EQ(b.block_table().blocks(), (std::vector<BlockId>{0}));
  EXPECT_EQ(c.block_table().blocks(), (std::vector<BlockId>{1, 4}));
  EXPECT_EQ(batch.block_table, (std::vector<int32_t>{2, 3, 0, -1, 1, 4}));
  EXPECT_EQ(batch.slot_mapping, (std::vector<int64_t>{8, 9, 10, 11, 12, 13, 3, 7, 16, 17}));
  // c's prompt has one more token after this chunk: no logits for it yet.
  EXPECT_EQ(batch.logits_rows, (std::vector<int32_t>{5, 6}));
}

TEST(BatchBuilder, RejectsItemsWithoutSlotsOrTokens) {
  KvCacheManager kv(4, 4);
  Sequence a = make_seq(0, {1, 2, 3}, kv);
  const std::vector<ScheduledChunk> no_slots = {{&a, 3}};
  EXPECT_THROW(BatchBuilder(4).build(no_slots), Error);
  ASSERT_TRUE(kv.allocate_slots(a.block_table(), 3));
  const std::vector<ScheduledChunk> too_many = {{&a, 4}};
  EXPECT_THROW(BatchBuilder(4).build(too_many), Error);
  const std::vector<ScheduledChunk> none = {{&a, 0}};
  EXPECT_THROW(BatchBuilder(4).build(none), Error);
  const std::vector<ScheduledChunk> ok = {{&a, 3}};
  EXPECT_EQ(BatchBuilder(4).build(ok).num_tokens(), 3);
}

}  // namespace
}  // namespace serval
