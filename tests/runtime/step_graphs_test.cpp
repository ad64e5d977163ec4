// StepGraphs on the CPU backend (its memory and copies; graphs are stand-ins):
// which decode steps it takes, the ladder it pads them to, the metadata it
// uploads, and that steps averaging kLongDecodeContext tokens or more, and
// steps under each context bound, find graphs of their own.
#include "runtime/step_graphs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace serval::testing {
namespace {

constexpr int32_t kBlockSize = 16, kMaxContext = 8192, kPadBlock = 0;

// A decode step of one token per sequence at the given contexts; sequence s
// owns blocks 1 + s * kStride onwards.
Batch decode_step(const std::vector<int32_t>& contexts) {
  const int32_t stride = kMaxContext / kBlockSize;
  Batch b;
  b.query_start = {0};
  b.max_blocks_per_seq = stride;
  for (size_t s = 0; s < contexts.size(); ++s) {
    const int32_t ctx = contexts[s], pos = ctx - 1;
    b.token_ids.push_back(int32_t(s) + 3);
    b.positions.push_back(pos);
    b.query_start.push_back(int32_t(s) + 1);
    b.context_len.push_back(ctx);
    for (int32_t k = 0; k < stride; ++k) b.block_table.push_back(1 + int32_t(s) * stride + k);
    // A context past kMaxContext (a step the graphs refuse) writes into its last block.
    const int32_t block = std::min(pos / kBlockSize, stride - 1);
    b.slot_mapping.push_back(int64_t(b.block_table[s * size_t(stride) + size_t(block)]) * kBlockSize +
                             pos % kBlockSize);
    b.logits_rows.push_back(int32_t(s));
  }
  return b;
}

struct NoGraph : DeviceGraph {
  void replay() override {}
};

// Steps like `first` and steps like `second` find graphs of their own: one
// stored for `first` is not found for `second`, and each finds its own.
void expect_graphs_of_their_own(StepGraphs& graphs, const BatchView& first, const BatchView& second) {
  graphs.store(first, std::make_unique<NoGraph>());
  EXPECT_NE(graphs.find(first), nullptr);
  EXPECT_EQ(graphs.find(second), nullptr);
  graphs.store(second, std::make_unique<NoGraph>());
  EXPECT_NE(graphs.find(second), graphs.find(first));
}

TEST(StepGraphs, PadsDecodeStepsUpTheLadder) {
  auto be = create_backend("cpu", 1);
  StepGraphs graphs(*be, 64, kMaxContext, kBlockSize, kPadBlock);
  EXPECT_EQ(graphs.padded_size(1), 1);
  EXPECT_EQ(graphs.padded_size(3), 4);
  EXPECT_EQ(graphs.padded_size(9), 16);
  EXPECT_EQ(graphs.padded_size(64), 64);
  EXPECT_TRUE(graphs.eligible(decode_step({5, 9, 100})));
  Batch prefill = decode_step({5, 9});
  prefill.query_start = {0, 1, 2};
  prefill.logits_rows = {1};  // a row without logits: not a decode step the graphs serve
  EXPECT_FALSE(graphs.eligible(prefill));
  EXPECT_FALSE(graphs.eligible(decode_step({kMaxContext + 1})));
}

TEST(StepGraphs, UploadsPaddedMetadataWithTheBound) {
  auto be = create_backend("cpu", 1);
  StepGraphs graphs(*be, 8, kMaxContext, kBlockSize, kPadBlock);
  Batch b = decode_step({5, 9, 100});
  b.token_source = {-1, 2, 0};
  const int32_t sampled[3] = {11, 12, 13};
  const BatchView v = graphs.upload(b, 4, sampled);
  EXPECT_EQ(v.num_seqs, 4);
  EXPECT_EQ(v.num_tokens, 4);
  EXPECT_EQ(v.max_context_len, 128);  // the bound of a longest context of 100, not 100
  EXPECT_EQ(v.mean_context_len, 0);   // a short step
  // The CPU backend's device memory is host memory: read the rows back.
  EXPECT_EQ(std::vector<int32_t>(v.context_len, v.context_len + 4), (std::vector<int32_t>{5, 9, 100, 1}));
  EXPECT_EQ(std::vector<int32_t>(v.positions, v.positions + 4), (std::vector<int32_t>{4, 8, 99, 0}));
  EXPECT_EQ(std::vector<int32_t>(v.query_start, v.query_start + 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(v.slot_mapping[3], int64_t(kPadBlock) * kBlockSize);  // the padding row writes the spare block
  EXPECT_EQ(std::vector<int32_t>(v.feed.source, v.feed.source + 4), (std::vector<int32_t>{-1, 2, 0, -1}));
  EXPECT_EQ(v.feed.sampled, sampled);
  // Table rows as wide as the bound (128 tokens: 8 blocks), each row's first blocks.
  ASSERT_EQ(v.max_blocks_per_seq, 128 / kBlockSize);
  for (int32_t s = 0; s < 3; ++s)
    for (int32_t k = 0; k < v.max_blocks_per_seq; ++k)
      EXPECT_EQ(v.block_table[s * v.max_blocks_per_seq + k], b.block_table[size_t(s * b.max_blocks_per_seq + k)]);
  // A step under the next bound sends wider rows to the same buffer.
  const Batch longer = decode_step({5, 900});
  const BatchView w = graphs.upload(longer, 2, nullptr);
  EXPECT_EQ(std::vector<int32_t>(w.feed.source, w.feed.source + 2), (std::vector<int32_t>{-1, -1}));  // no feed
  ASSERT_EQ(w.max_blocks_per_seq, 1024 / kBlockSize);
  EXPECT_EQ(w.block_table, v.block_table);
  EXPECT_EQ(w.block_table[w.max_blocks_per_seq + 56], longer.block_table[size_t(longer.max_blocks_per_seq) + 56]);
}

TEST(StepGraphs, LongContextStepsHaveGraphsOfTheirOwn) {
  auto be = create_backend("cpu", 1);
  StepGraphs graphs(*be, 8, kMaxContext, kBlockSize, kPadBlock);
  // Mean 2048 exactly (the class starts there), and just below it.
  const BatchView at = graphs.upload(decode_step({1024, kLongDecodeContext * 2 - 1024}), 2, nullptr);
  EXPECT_EQ(at.mean_context_len, kLongDecodeContext);
  const BatchView below = graphs.upload(decode_step({1024, kLongDecodeContext * 2 - 1025}), 2, nullptr);
  EXPECT_EQ(below.mean_context_len, 0);
  // A long step padded with short rows is still long: the class is the real rows'.
  EXPECT_EQ(graphs.upload(decode_step({5000, 3000, 2500}), 4, nullptr).mean_context_len, kLongDecodeContext);

  ASSERT_EQ(below.max_context_len, at.max_context_len);  // the same size and bound (8192); one is long
  expect_graphs_of_their_own(graphs, below, at);
  EXPECT_EQ(graphs.size(), 2);
  graphs.clear();
  EXPECT_EQ(graphs.find(below), nullptr);
  EXPECT_EQ(graphs.find(at), nullptr);
}

TEST(StepGraphs, StepsUnderEachContextBoundHaveGraphsOfTheirOwn) {
  auto be = create_backend("cpu", 1);
  StepGraphs graphs(*be, 8, kMaxContext, kBlockSize, kPadBlock);
  // 128, 1024, 8192 (= kMaxContext): the first that holds the longest context.
  EXPECT_EQ(graphs.context_bound(1), 128);
  EXPECT_EQ(graphs.context_bound(128), 128);
  EXPECT_EQ(graphs.context_bound(129), 1024);
  EXPECT_EQ(graphs.context_bound(1025), kMaxContext);
  EXPECT_EQ(graphs.context_bound(kMaxContext), kMaxContext);
  StepGraphs small(*be, 8, 300, kBlockSize, kPadBlock);
  EXPECT_EQ(small.context_bound(200), 300);  // never past the longest context allowed

  // The bound follows the longest real row; padding rows do not count.
  const BatchView a = graphs.upload(decode_step({5, 128}), 4, nullptr);
  EXPECT_EQ(a.max_context_len, 128);
  const BatchView b = graphs.upload(decode_step({5, 129}), 4, nullptr);
  EXPECT_EQ(b.max_context_len, 1024);
  expect_graphs_of_their_own(graphs, a, b);
  // Another size under the same bound is another graph.
  EXPECT_EQ(graphs.find(graphs.upload(decode_step({5}), 1, nullptr)), nullptr);
}

TEST(StepGraphs, ClassStartsAreWhereStepsNeedAnotherGraph) {
  EXPECT_EQ(StepGraphs::class_starts(kMaxContext), (std::vector<int32_t>{1, 129, 1025, kLongDecodeContext}));
  EXPECT_EQ(StepGraphs::class_starts(100000),
            (std::vector<int32_t>{1, 129, 1025, kLongDecodeContext, 8193, 65537}));
  EXPECT_EQ(StepGraphs::class_starts(300), (std::vector<int32_t>{1, 129}));
  // A step at each start finds no graph of a step one token shorter.
  auto be = create_backend("cpu", 1);
  for (int32_t start : StepGraphs::class_starts(kMaxContext)) {
    if (start == 1) continue;
    StepGraphs graphs(*be, 8, kMaxContext, kBlockSize, kPadBlock);
    expect_graphs_of_their_own(graphs, graphs.upload(decode_step({start - 1}), 1, nullptr),
                               graphs.upload(decode_step({start}), 1, nullptr));
  }
}

}  // namespace
}  // namespace serval::testing
