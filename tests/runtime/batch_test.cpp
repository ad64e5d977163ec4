// Batch::validate: every inconsistency that could make the forward pass read
// or write out of range is rejected with a message naming it.
#include "runtime/batch.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "tiny_model.h"

namespace serval::testing {
namespace {

constexpr int32_t kBlock = 4;
constexpr int64_t kBlocks = 8;

// Two sequences: one prefilling 6 tokens, one decoding its 6th token.
Batch good_batch() {
  PagedSeqs seqs(kBlock, {5, 2, 7, 0, 1, 3}, 3);
  const int a = seqs.add_sequence(), b = seqs.add_sequence();
  seqs.step({b}, {{1, 2, 3, 4, 5}}, false);
  return seqs.step({a, b}, {{9, 8, 7, 6, 5, 4}, {3}}, false);
}

void expect_rejected(const std::function<void(Batch&)>& mutate, const std::string& message_part) {
  Batch b = good_batch();
  mutate(b);
  try {
    b.validate(kBlock, kBlocks);
    ADD_FAILURE() << "accepted a bad batch; expected an error containing \"" << message_part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << message_part << "\"";
  }
}

TEST(BatchValidate, AcceptsAConsistentBatch) {
  const Batch b = good_batch();
  EXPECT_EQ(b.num_tokens(), 7);
  EXPECT_EQ(b.num_seqs(), 2);
  EXPECT_NO_THROW(b.validate(kBlock, kBlocks));
}

TEST(BatchValidate, RejectsInconsistentSizes) {
  expect_rejected([](Batch& b) { b = Batch{}; }, "no tokens");
  expect_rejected([](Batch& b) { b.positions.pop_back(); }, "positions");
  expect_rejected([](Batch& b) { b.slot_mapping.push_back(0); }, "slot_mapping");
  expect_rejected([](Batch& b) { b.query_start.pop_back(); }, "query_start");
  expect_rejected([](Batch& b) { b.block_table.pop_back(); }, "block_table");
  expect_rejected([](Batch& b) { b.max_blocks_per_seq = 0; }, "max_blocks_per_seq");
  expect_rejected([](Batch& b) { b.context_len.clear(); }, "no sequences");
}

TEST(BatchValidate, RejectsBadQueryStarts) {
  expect_rejected([](Batch& b) { b.query_start[0] = 1; }, "query_start[0]");
  expect_rejected([](Batch& b) { b.query_start.back() = 6; }, "number of tokens");
  expect_rejected([](Batch& b) { b.query_start[1] = 7; }, "no new tokens");
  expect_rejected([](Batch& b) { b.query_start[1] = 9; }, "runs past the 7 tokens");
  expect_rejected([](Batch& b) { b.query_start = {0, 8, 7}; }, "runs past the 7 tokens");
}

TEST(BatchValidate, RejectsPositionsOutsideTheContext) {
  expect_rejected([](Batch& b) { b.context_len[0] = 5; }, "smaller than its 6 new tokens");
  expect_rejected([](Batch& b) { b.positions[2] = 7; }, "position 7");
  expect_rejected([](Batch& b) { b.positions[6] = -1; }, "expected 5");
  expect_rejected([](Batch& b) { b.context_len[1] = 13; }, "more than max_blocks_per_seq");
}

TEST(BatchValidate, RejectsBlocksAndSlotsOutsideThePool) {
  expect_rejected([](Batch& b) { b.block_table[1] = int32_t(kBlocks); }, "outside the pool of 8 blocks");
  expect_rejected([](Batch& b) { b.block_table[0] = -1; }, "outside the pool");
  expect_rejected([](Batch& b) { b.slot_mapping[3] = kBlocks * kBlock; }, "outside the pool of 32 slots");
  expect_rejected([](Batch& b) { b.slot_mapping[3] = -4; }, "outside the pool");
  // In range, but not where the block table puts that position.
  expect_rejected([](Batch& b) { b.slot_mapping[0] += 1; }, "but block_table puts position 0");
}

TEST(BatchValidate, RejectsBadLogitsRows) {
  expect_rejected([](Batch& b) { b.logits_rows = {5, 5}; }, "strictly ascending");
  expect_rejected([](Batch& b) { b.logits_rows = {6, 2}; }, "strictly ascending");
  expect_rejected([](Batch& b) { b.logits_rows = {7}; }, "outside the 7 tokens");
  expect_rejected([](Batch& b) { b.logits_rows = {-1}; }, "outside the 7 tokens");
}

TEST(BatchValidate, UnusedBlockTableEntriesMayBeMinusOne) {
  Batch b = good_batch();
  // Sequence b uses 2 of its 3 entries; the third is -1 from PagedSeqs.
  EXPECT_EQ(b.block_table[5], -1);
  EXPECT_NO_THROW(b.validate(kBlock, kBlocks));
}

}  // namespace
}  // namespace serval::testing
