// The forward pass must not depend on how work is batched or where KV blocks
// live: ragged multi-sequence batches, chunked prefill, shuffled block ids,
// mixed prefill+decode steps and incremental decode all give the logits of a
// plain whole-prompt prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"
#include "runtime/model_runner.h"
#include "tiny_model.h"

namespace serval::testing {
namespace {

constexpr int32_t kBlock = 4;
constexpr int32_t kPool = 128;
// Different GEMM shapes may round differently; anything beyond this is a bug.
constexpr double kTol = 2e-5;

struct Fixture {
  TinySpec spec;
  ModelConfig cfg;
  WeightStore weights;
  Fixture() {
    spec.arch = "qwen2";
    spec.heads = 8;
    spec.kv_heads = 2;
    spec.head_dim = 8;
    spec.bias = true;
    spec.layers = 3;
    spec.seed = 11;
    cfg = tiny_config(spec);
    weights = tiny_weights(cfg, spec);
  }
  std::unique_ptr<ModelRunner> runner(bool batch_invariant = false) const {
    RunnerOptions o;
    o.block_size = kBlock;
    o.kv_cache_tokens = kPool * kBlock;
    o.threads = 2;
    o.batch_invariant = batch_invariant;
    return ModelRunner::create(cfg, weights, o);
  }
  std::vector<int32_t> prompt(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(cfg.vocab_size));
    return t;
  }
  // Logits of every position of `tokens`, prefilled in one step.
  std::vector<float> whole_prefill(const std::vector<int32_t>& tokens) const {
    auto r = runner();
    PagedSeqs seqs(kBlock, contiguous(), 16);
    std::vector<float> logits;
    r->forward(seqs.step({seqs.add_sequence()}, {tokens}, true), logits);
    return logits;
  }
  static std::vector<int32_t> contiguous() {
    std::vector<int32_t> b(kPool);
    std::iota(b.begin(), b.end(), 0);
    return b;
  }
  std::vector<float> row(const std::vector<float>& logits, size_t r) const {
    const size_t V = size_t(cfg.vocab_size);
    return {logits.begin() + r * V, logits.begin() + (r + 1) * V};
  }
};

TEST(BatchInvariance, RaggedPrefillOfThreeSequencesEqualsEachAlone) {
  Fixture f;
  const std::vector<std::vector<int32_t>> prompts = {f.prompt(9, 1), f.prompt(3, 2), f.prompt(14, 3)};
  auto r = f.runner();
  PagedSeqs seqs(kBlock, Fixture::contiguous(), 16);
  std::vector<int> ids = {seqs.add_sequence(), seqs.add_sequence(), seqs.add_sequence()};
  std::vector<float> together;
  r->forward(seqs.step(ids, prompts, true), together);

  size_t row = 0;
  for (const auto& p : prompts) {
    const std::vector<float> alone = f.whole_prefill(p);
    for (size_t t = 0; t < p.size(); ++t, ++row)
      EXPECT_LT(rel_error(f.row(together, row), f.row(alone, t)), kTol) << "row " << row;
  }
}

// --batch-invariant on the CPU: the same sequence's logits bitwise equal
// alone (a whole prefill, then one-row decode steps) and among others (its
// prompt in chunks of 5, 1 and 8 beside other sequences' prefill and decode
// rows, then decode steps of 12 rows), where the default kernels change with
// the row count (streaming up to 8 rows, sgemm above).
TEST(BatchInvariance, BatchInvariantModeGivesBitwiseTheLogitsAlone) {
  Fixture f;
  const std::vector<int32_t> p = f.prompt(14, 21), forced = f.prompt(4, 22);
  std::vector<std::vector<float>> alone, together;
  {
    auto r = f.runner(true);
    PagedSeqs seqs(kBlock, Fixture::contiguous(), 16);
    const int s = seqs.add_sequence();
    std::vector<float> logits;
    r->forward(seqs.step({s}, {p}, false), logits);
    alone.push_back(logits);
    for (int32_t t : forced) {
      r->forward(seqs.step({s}, {{t}}, false), logits);
      alone.push_back(logits);
    }
  }
  auto r = f.runner(true);
  std::vector<int32_t> blocks = Fixture::contiguous();
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(9));
  PagedSeqs seqs(kBlock, blocks, 16);
  const int target = seqs.add_sequence();
  std::vector<int> others;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 11; ++i) {
    others.push_back(seqs.add_sequence());
    prompts.push_back(f.prompt(2 + i % 5, 30 + uint32_t(i)));
  }
  std::vector<float> logits;
  r->forward(seqs.step(others, prompts, false), logits);
  size_t at = 0;
  for (size_t n : {5, 1, 8}) {
    std::vector<int> ids = others;
    std::vector<std::vector<int32_t>> chunks(others.size(), std::vector<int32_t>{3});
    ids.push_back(target);
    chunks.push_back({p.begin() + long(at), p.begin() + long(at + n)});
    at += n;
    r->forward(seqs.step(ids, chunks, false), logits);
  }
  together.push_back(f.row(logits, others.size()));
  for (int32_t t : forced) {
    std::vector<int> ids = others;
    std::vector<std::vector<int32_t>> chunks(others.size(), std::vector<int32_t>{5});
    ids.push_back(target);
    chunks.push_back({t});
    r->forward(seqs.step(ids, chunks, false), logits);
    together.push_back(f.row(logits, others.size()));
  }
  ASSERT_EQ(together.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "step " << i;
}

TEST(BatchInvariance, ChunkedPrefillEqualsWholePrefill) {
  Fixture f;
  const std::vector<int32_t> p = f.prompt(23, 4);
  const std::vector<float> whole = f.whole_prefill(p);
  for (const std::vector<size_t>& split : {std::vector<size_t>{7, 9, 7}, std::vector<size_t>{12, 11}}) {
    auto r = f.runner();
    PagedSeqs seqs(kBlock, Fixture::contiguous(), 16);
    const int s = seqs.add_sequence();
    size_t start = 0;
    for (size_t n : split) {
      std::vector<float> logits;
      r->forward(seqs.step({s}, {{p.begin() + start, p.begin() + start + n}}, true), logits);
      for (size_t t = 0; t < n; ++t)
        EXPECT_LT(rel_error(f.row(logits, t), f.row(whole, start + t)), kTol) << "position " << start + t;
      start += n;
    }
  }
}

TEST(BatchInvariance, ShuffledBlockIdsGiveIdenticalLogits) {
  Fixture f;
  const std::vector<int32_t> p = f.prompt(21, 5);
  std::vector<int32_t> shuffled = Fixture::contiguous();
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  std::vector<float> a, b;
  {
    auto r = f.runner();
    PagedSeqs seqs(kBlock, Fixture::contiguous(), 16);
    const int s = seqs.add_sequence();
    r->forward(seqs.step({s}, {{p.begin(), p.begin() + 13}}, true), a);
    r->forward(seqs.step({s}, {{p.begin() + 13, p.end()}}, true), a);
  }
  {
    auto r = f.runner();
    PagedSeqs seqs(kBlock, shuffled, 16);
    const int s = seqs.add_sequence();
    r->forward(seqs.step({s}, {{p.begin(), p.begin() + 13}}, true), b);
    r->forward(seqs.step({s}, {{p.begin() + 13, p.end()}}, true), b);
  }
  EXPECT_EQ(a, b);  // same computation, only the addresses differ
}

TEST(BatchInvariance, DecodeAfterPrefillEqualsFullRecompute) {
  Fixture f;
  std::vector<int32_t> tokens = f.prompt(10, 6);
  auto r = f.runner();
  PagedSeqs seqs(kBlock, Fixture::contiguous(), 16);
  const int s = seqs.add_sequence();
  std::vector<float> logits;
  r->forward(seqs.step({s}, {tokens}, false), logits);
  for (int step = 0; step < 8; ++step) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    tokens.push_back(next);
    r->forward(seqs.step({s}, {{next}}, false), logits);
    const std::vector<float> full = f.whole_prefill(tokens);
    EXPECT_LT(rel_error(logits, f.row(full, tokens.size() - 1)), kTol) << "decode step " << step;
  }
}

TEST(BatchInvariance, MixedDecodeAndPrefillStepEqualsSeparateRuns) {
  // Sequence A decodes while B prefills and C prefills a second chunk, in one step.
  Fixture f;
  const std::vector<int32_t> a = f.prompt(6, 8), b = f.prompt(11, 9), c = f.prompt(17, 10);
  auto r = f.runner();
  std::vector<int32_t> blocks = Fixture::contiguous();
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(3));
  PagedSeqs seqs(kBlock, blocks, 16);
  const int sa = seqs.add_sequence(), sb = seqs.add_sequence(), sc = seqs.add_sequence();
  std::vector<float> logits;
  r->forward(seqs.step({sa, sc}, {{a.begin(), a.end() - 1}, {c.begin(), c.begin() + 5}}, false), logits);
  r->forward(seqs.step({sa, sb, sc}, {{a.back()}, b, {c.begin() + 5, c.end()}}, false), logits);
  ASSERT_EQ(logits.size(), 3 * size_t(f.cfg.vocab_size));
  EXPECT_LT(rel_error(f.row(logits, 0), f.row(f.whole_prefill(a), a.size() - 1)), kTol);
  EXPECT_LT(rel_error(f.row(logits, 1), f.row(f.whole_prefill(b), b.size() - 1)), kTol);
  EXPECT_LT(rel_error(f.row(logits, 2), f.row(f.whole_prefill(c), c.size() - 1)), kTol);
}

TEST(BatchInvariance, NoLogitsRowsReturnsEmptyLogitsButFillsCache) {
  Fixture f;
  const std::vector<int32_t> p = f.prompt(12, 12);
  auto r = f.runner();
  PagedSeqs seqs(kBlock, Fixture::contiguous(), 16);
  const int s = seqs.add_sequence();
  Batch first = seqs.step({s}, {{p.begin(), p.begin() + 8}}, false);
  first.logits_rows.clear();  // a prefill chunk that is not the last needs no logits
  std::vector<float> logits = {1.0f};
  r->forward(first, logits);
  EXPECT_TRUE(logits.empty());
  r->forward(seqs.step({s}, {{p.begin() + 8, p.end()}}, false), logits);
  EXPECT_LT(rel_error(logits, f.row(f.whole_prefill(p), p.size() - 1)), kTol);
}

TEST(BatchInvariance, BatchLargerThanTheWorkspaceGrowsIt) {
  // The runner starts with room for min(max_position, 512) = 256 tokens a step.
  Fixture f;
  const std::vector<std::vector<int32_t>> prompts = {f.prompt(150, 13), f.prompt(140, 14)};
  auto r = f.runner();
  PagedSeqs seqs(kBlock, Fixture::contiguous(), 40);
  std::vector<float> together;
  r->forward(seqs.step({seqs.add_sequence(), seqs.add_sequence()}, prompts, false), together);
  ASSERT_EQ(together.size(), 2 * size_t(f.cfg.vocab_size));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = f.runner();
    PagedSeqs one(kBlock, Fixture::contiguous(), 40);
    std::vector<float> logits;
    alone->forward(one.step({one.add_sequence()}, {prompts[i]}, false), logits);
    EXPECT_LT(rel_error(f.row(together, i), logits), kTol) << "sequence " << i;
  }
}

TEST(BatchInvariance, ForkWithCopiedPartialBlockEqualsFreshRuns) {
  // Copy-on-write: B forks A after a 10-token prompt (2 full blocks shared, the
  // partial third block copied), then both decode different tokens in one step.
  Fixture f;
  const std::vector<int32_t> p = f.prompt(10, 15);
  auto r = f.runner();
  std::vector<int32_t> blocks = Fixture::contiguous();
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(5));
  PagedSeqs seqs(kBlock, blocks, 16);
  const int a = seqs.add_sequence();
  std::vector<float> logits;
  r->forward(seqs.step({a}, {p}, false), logits);
  std::vector<std::pair<int32_t, int32_t>> copies;
  const int b = seqs.fork(a, copies);
  ASSERT_EQ(copies.size(), 1u);
  r->copy_blocks(copies);
  r->forward(seqs.step({a, b}, {{3}, {4}}, false), logits);
  std::vector<int32_t> pa = p, pb = p;
  pa.push_back(3);
  pb.push_back(4);
  EXPECT_LT(rel_error(f.row(logits, 0), f.row(f.whole_prefill(pa), pa.size() - 1)), kTol);
  EXPECT_LT(rel_error(f.row(logits, 1), f.row(f.whole_prefill(pb), pb.size() - 1)), kTol);
  EXPECT_THROW(r->copy_blocks({{0, kPool}}), Error);
}

}  // namespace
}  // namespace serval::testing
