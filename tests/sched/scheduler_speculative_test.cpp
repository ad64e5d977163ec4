// Speculative decoding in the scheduler: rows carry drafts (right for a
// while, then wrong), commit keeps the accepted prefix and rolls the rest
// back. The harness's shadow KV store checks every position a step reads, so
// a slot of a rejected token left in a block table, or a block cached from
// one and adopted by a later request, fails the run; outputs equal the
// requests' solo continuations under chunked prefill, the prefix cache and
// preemption.
#include <gtest/gtest.h>

#include <random>

#include "scheduler_harness.h"

namespace serval {
namespace {

using namespace sched_testing;

// Proposes up to max_tokens tokens: the true continuation for a random
// number of them, then wrong ones.
Scheduler::DraftFn noisy_drafter(std::mt19937& rng) {
  return [&rng](Sequence& seq, std::span<const int32_t> tokens, int32_t max_tokens) {
    std::vector<int32_t> t(tokens.begin(), tokens.end());
    const int32_t len = 1 + int32_t(rng() % uint32_t(max_tokens));
    const int32_t right = int32_t(rng() % uint32_t(len + 1));
    for (int32_t j = 0; j < len; ++j) {
      const int32_t truth = next_token(t);
      const int32_t token = j < right ? truth : (truth + 1 + int32_t(rng() % 5)) % kVocab;
      seq.draft_ids().push_back(token);
      t.push_back(token);
    }
  };
}

TEST(SchedulerSpeculative, RejectedDraftsAreRolledBackAndNeverCached) {
  for (bool prefix_cache : {false, true}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      std::mt19937 rng(seed);
      // 24 blocks of 4: five requests of up to ~70 tokens do not fit at once.
      Harness h(24, 4, prefix_cache, config(/*budget=*/12, /*max_seqs=*/8));
      h.sched.set_drafter(noisy_drafter(rng), 5);
      const std::vector<int32_t> shared = make_prompt(18, 3);
      std::map<int64_t, std::vector<int32_t>> prompts;
      for (int64_t id = 0; id < 5; ++id) {
        std::vector<int32_t> p = shared;
        const std::vector<int32_t> tail = make_prompt(3 + id * 2, int32_t(id) + 7);
        p.insert(p.end(), tail.begin(), tail.end());
        prompts[id] = p;
        h.add(id, p, 40);
      }
      h.run_all();
      for (const auto& [id, p] : prompts) {
        ASSERT_TRUE(h.done.count(id));
        EXPECT_EQ(h.done.at(id).output_ids(), reference(p, 40)) << "cache " << prefix_cache << " seed " << seed;
      }
      EXPECT_GT(h.accepted_tokens, 0);
      EXPECT_LT(h.accepted_tokens, h.draft_tokens);
      EXPECT_GT(h.sched.stats().num_preemptions, 0);
      if (prefix_cache) EXPECT_GT(h.sched.stats().prefix_hit_tokens, 0);
    }
  }
}

TEST(SchedulerSpeculative, DraftsStayWithinMaxTokensAndFreeEmptiedBlocks) {
  Harness h(16, 4, /*prefix_cache=*/true, config(64));
  int32_t asked = -1;
  h.sched.set_drafter(
      [&](Sequence& seq, std::span<const int32_t> tokens, int32_t max_tokens) {
        asked = max_tokens;
        // The first draft token is wrong: the rest is rejected with it.
        const int32_t wrong = (next_token(std::vector<int32_t>(tokens.begin(), tokens.end())) + 1) % kVocab;
        seq.draft_ids().assign(size_t(max_tokens), wrong);
      },
      6);
  const std::vector<int32_t> prompt = make_prompt(6, 1);
  h.add(1, prompt, 4);
  h.step();  // the prompt and the first token
  EXPECT_EQ(asked, -1);
  const int64_t free_before = h.kv.usage().free_blocks;
  StepPlan plan = h.step();  // 1 + 2 draft tokens (max_tokens 4: 1 output + 3 more at most)
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(plan.num_tokens, 3);
  const Sequence* seq = h.sched.find(1);
  ASSERT_NE(seq, nullptr);
  EXPECT_TRUE(seq->draft_ids().empty());
  // Rejected: one more token, computed up to the last known one.
  EXPECT_EQ(seq->output_ids().size(), 2u);
  EXPECT_EQ(seq->num_computed_tokens(), 7);
  EXPECT_EQ(seq->block_table().num_tokens(), 7);
  EXPECT_EQ(seq->block_table().num_blocks(), 2);
  EXPECT_EQ(h.kv.usage().free_blocks, free_before);  // the block of positions 8.. went back
  h.run_all();
  EXPECT_EQ(h.done.at(1).output_ids(), reference(prompt, 4));
}

TEST(SchedulerSpeculative, DraftsShareTheLogitsRowsOfScoredTokens) {
  SchedulerConfig c = config(64);
  c.max_scored_rows = 5;  // rows beyond one per sequence
  Harness h(64, 4, /*prefix_cache=*/false, c);
  h.sched.set_drafter(
      [](Sequence& seq, std::span<const int32_t>, int32_t max_tokens) { seq.draft_ids().assign(size_t(max_tokens), 1); },
      4);
  for (int64_t id = 0; id < 3; ++id) h.add(id, make_prompt(5, int32_t(id)), 20);
  h.step();  // prompts
  for (int i = 0; i < 5; ++i) {
    const StepPlan plan = h.step();
    int32_t drafts = 0;
    for (int32_t d : plan.num_draft) drafts += d;
    EXPECT_EQ(drafts, 5) << "step " << i;  // 4 + 1 + 0: the rows run out
  }
  h.run_all();
  for (int64_t id = 0; id < 3; ++id) EXPECT_EQ(h.done.at(id).output_ids(), reference(make_prompt(5, int32_t(id)), 20));
}

}  // namespace
}  // namespace serval
