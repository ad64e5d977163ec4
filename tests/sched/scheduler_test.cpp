// Scheduler tests with a fake model: the "forward" writes (token, position)
// into a shadow KV store at each scheduled slot and checks that every context
// position of a sequence reads back its own token through the block table
// (so a wrong prefix-cache adoption, copy or preemption shows up); the
// "sampler" picks a token that depends only on the sequence's tokens, so a
// request's output is independent of batching, chunking and preemption.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

#include "core/error.h"
#include "scheduler_harness.h"

namespace serval {
namespace {

using namespace sched_testing;

TEST(SchedulerTest, TokenBudgetRespectedAndOutputsMatchReference) {
  for (int64_t budget : {1, 7, 16, 64, 4096}) {
    Harness h(256, 4, /*prefix_cache=*/true, config(budget));
    for (int i = 0; i < 12; ++i) h.add(i, make_prompt(3 + i * 5, i % 4), 5 + i % 3);
    h.run_all();
    for (int i = 0; i < 12; ++i) {
      const Sequence& s = h.done.at(i);
      EXPECT_EQ(s.finish_reason(), FinishReason::kLength);
      EXPECT_EQ(s.output_ids(), reference(make_prompt(3 + i * 5, i % 4), 5 + i % 3))
          << "budget " << budget << " request " << i;
    }
  }
}

TEST(SchedulerTest, MaxNumSeqsBoundsRunningRequests) {
  Harness h(256, 4, false, config(4096, /*max_seqs=*/3));
  for (int i = 0; i < 10; ++i) h.add(i, make_prompt(5, i), 4);
  int max_items = 0;
  while (h.sched.has_unfinished()) {
    const StepPlan plan = h.step();
    max_items = std::max(max_items, int(plan.items.size()));
    EXPECT_LE(h.sched.num_running(), 3);
  }
  EXPECT_EQ(max_items, 3);
  EXPECT_EQ(h.done.size(), 10u);
}

TEST(SchedulerTest, ChunkedPrefillSplitsLongPromptAndMixesWithDecode) {
  Harness h(256, 4, false, config(32));
  h.add(0, make_prompt(6, 1), 20);
  h.step();  // request 0's prompt: 6 tokens, then decodes
  h.add(1, make_prompt(100, 2), 3);
  std::vector<int> chunks;
  for (int i = 0; i < 4; ++i) {
    const StepPlan plan = h.step();
    ASSERT_EQ(plan.items.size(), 2u);
    EXPECT_EQ(h.ids, (std::vector<int64_t>{0, 1}));  // the decode comes first
    EXPECT_EQ(plan.items[0].num_new_tokens, 1);
    chunks.push_back(plan.items[1].num_new_tokens);
    // Request 1 gets logits only with its last chunk.
    EXPECT_EQ(plan.sample_rows.size(), i < 3 ? 1u : 2u);
    EXPECT_EQ(plan.num_tokens, 1 + chunks.back());
  }
  EXPECT_EQ(chunks, (std::vector<int>{31, 31, 31, 7}));
  h.run_all();
  EXPECT_EQ(h.done.at(1).output_ids(), reference(make_prompt(100, 2), 3));
  EXPECT_EQ(h.done.at(0).output_ids(), reference(make_prompt(6, 1), 20));
}

TEST(SchedulerTest, WaitingRequestIsNotStarvedUnderContinuousLoad) {
  // Two slots; new short requests arrive every step. The long request queued
  // behind the first two must be admitted once one of them finishes, not
  // overtaken by later arrivals.
  Harness h(1024, 4, false, config(64, /*max_seqs=*/2));
  h.add(0, make_prompt(8, 0), 6);
  h.add(1, make_prompt(8, 1), 6);
  h.add(2, make_prompt(40, 2), 4);
  int64_t next_id = 3;
  int admitted_at = -1;
  for (int step = 0; step < 50 && admitted_at < 0; ++step) {
    h.add(next_id, make_prompt(4, int32_t(next_id % 5)), 2);
    ++next_id;
    h.step();
    for (int64_t id : h.ids)
      if (id == 2) admitted_at = step;
  }
  // Requests 0 and 1 need 6 steps (1 prefill + 5 decodes); 2 comes right after.
  EXPECT_EQ(admitted_at, 6);
  h.run_all();
  EXPECT_EQ(h.done.at(2).output_ids(), reference(make_prompt(40, 2), 4));
}

TEST(SchedulerTest, PreemptsLatestArrivedAmongEqualPriorityAndRecomputes) {
  // 4 blocks of 4 tokens; three 4-token prompts take one block each. At the
  // first decode, 0 takes the last free block; 1 needs one: 2 (latest) goes.
  Harness h(4, 4, false, config(4096));
  for (int i = 0; i < 3; ++i) h.add(i, make_prompt(4, i), 6);
  h.step();
  EXPECT_EQ(h.sched.num_running(), 3);
  const StepPlan plan = h.step();
  EXPECT_EQ(plan.num_preempted, 1);
  EXPECT_EQ(h.sched.stats().num_preemptions, 1);
  ASSERT_NE(h.sched.find(2), nullptr);
  EXPECT_EQ(h.sched.find(2)->num_computed_tokens(), 0);
  EXPECT_EQ(h.sched.find(2)->output_ids().size(), 1u);  // its sampled token stays
  EXPECT_EQ(h.sched.num_waiting(), 1);
  h.run_all();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(h.done.at(i).output_ids(), reference(make_prompt(4, i), 6)) << i;
}

TEST(SchedulerTest, PreemptsLowestPriorityFirst) {
  Harness h(4, 4, false, config(4096));
  h.add(0, make_prompt(4, 0), 6, prio(0));
  h.add(1, make_prompt(4, 1), 6, prio(5));  // least important
  h.add(2, make_prompt(4, 2), 6, prio(0));  // latest, but more important
  h.step();
  const StepPlan plan = h.step();
  EXPECT_EQ(plan.num_preempted, 1);
  EXPECT_EQ(h.sched.find(1)->num_computed_tokens(), 0);
  EXPECT_GT(h.sched.find(2)->num_computed_tokens(), 0);
  h.run_all();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(h.done.at(i).output_ids(), reference(make_prompt(4, i), 6)) << i;
}

TEST(SchedulerTest, WaitingRequestsServedInPriorityOrder) {
  Harness h(256, 4, false, config(4096, /*max_seqs=*/1));
  h.add(0, make_prompt(4, 0), 1, prio(3));
  h.add(1, make_prompt(4, 1), 1, prio(1));
  h.add(2, make_prompt(4, 2), 1, prio(1));
  std::vector<int64_t> order;
  while (h.sched.has_unfinished()) {
    h.step();
    order.insert(order.end(), h.ids.begin(), h.ids.end());
  }
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 0}));
}

TEST(SchedulerTest, TightPoolForcesPreemptionsYetOutputsMatch) {
  for (bool prefix_cache : {false, true}) {
    for (int64_t budget : {5, 16, 4096}) {
      Harness h(12, 4, prefix_cache, config(budget));
      for (int i = 0; i < 16; ++i)
        h.add(i, make_prompt(2 + (i * 7) % 20, i % 3), 4 + (i * 5) % 17, prio(i % 2));
      h.run_all();
      EXPECT_GT(h.sched.stats().num_preemptions, 0);
      for (int i = 0; i < 16; ++i)
        EXPECT_EQ(h.done.at(i).output_ids(),
                  reference(make_prompt(2 + (i * 7) % 20, i % 3), 4 + (i * 5) % 17))
            << "request " << i << " budget " << budget << " cache " << prefix_cache;
    }
  }
}

TEST(SchedulerTest, DeadlineExpiryFinishesWithTimeout) {
  Harness h(256, 4, false, config(4096, /*max_seqs=*/1));
  const auto t0 = SchedulerClock::now();
  using std::chrono::milliseconds;
  h.add(0, make_prompt(6, 0), 50, deadline(t0 + milliseconds(30)));  // runs, then expires
  h.add(1, make_prompt(6, 1), 5, deadline(t0 + milliseconds(10)));   // expires waiting
  h.add(2, make_prompt(6, 2), 3);
  h.step(t0);
  EXPECT_EQ(h.kv.usage().used_blocks, 2);
  StepPlan plan = h.step(t0 + milliseconds(20));
  EXPECT_EQ(plan.finished, (std::vector<int64_t>{1}));
  plan = h.step(t0 + milliseconds(30));
  EXPECT_EQ(plan.finished, (std::vector<int64_t>{0}));
  EXPECT_EQ(h.ids, (std::vector<int64_t>{2}));  // request 2 takes the freed slot at once
  EXPECT_EQ(h.done.at(0).finish_reason(), FinishReason::kTimeout);
  EXPECT_EQ(h.done.at(1).finish_reason(), FinishReason::kTimeout);
  EXPECT_STREQ(finish_reason_name(FinishReason::kTimeout), "timeout");
  EXPECT_STREQ(finish_reason_name(FinishReason::kError), "error");
  h.run_all();
  EXPECT_EQ(h.done.at(2).finish_reason(), FinishReason::kLength);
}

TEST(SchedulerTest, FullQueueRefusesNewRequests) {
  Harness h(256, 4, false, config(4096, 256, /*max_queue=*/2));
  h.add(0, make_prompt(4, 0), 2);
  h.add(1, make_prompt(4, 1), 2);
  try {
    h.add(2, make_prompt(4, 2), 2);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waiting queue is full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.sched.num_waiting(), 2);
  h.step();  // both admitted: the queue has room again
  h.add(2, make_prompt(4, 2), 2);
  h.run_all();
  EXPECT_EQ(h.done.size(), 3u);
}

TEST(SchedulerTest, RequestThatCanNeverFitIsRefusedAtSubmission) {
  SchedulerConfig c = config(4096);
  c.max_model_len = 64;
  Harness h(8, 4, false, c);  // 32 tokens of KV in all
  try {
    h.add(0, make_prompt(60, 0), 10);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  try {
    h.add(1, make_prompt(30, 0), 10);  // 39 tokens through the model > 32 slots
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV blocks"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(h.sched.has_unfinished());
  h.add(2, make_prompt(30, 0), 3);  // 32 tokens: fits exactly
  h.add(3, make_prompt(4, 1), 2);
  EXPECT_THROW(h.add(3, make_prompt(4, 1), 2), Error);  // id 3 is already queued
  h.run_all();
  EXPECT_EQ(h.done.at(2).output_ids(), reference(make_prompt(30, 0), 3));
}

TEST(SchedulerTest, PrefixCacheHitReducesComputedTokens) {
  for (bool prefix_cache : {false, true}) {
    Harness h(256, 4, prefix_cache, config(4096));
    std::vector<int32_t> first = make_prompt(40, 1);
    h.add(0, first, 3);
    h.run_all();
    std::vector<int32_t> second(first.begin(), first.begin() + 33);
    for (int i = 0; i < 9; ++i) second.push_back(int32_t(50 + i));
    h.add(1, second, 3);
    const StepPlan plan = h.step();
    ASSERT_EQ(plan.items.size(), 1u);
    // 32 shared tokens = 8 full blocks (the 33rd shared token is in a block
    // that differs afterwards).
    EXPECT_EQ(plan.items[0].num_new_tokens, prefix_cache ? 42 - 32 : 42);
    EXPECT_EQ(h.sched.stats().prefix_hit_tokens, prefix_cache ? 32 : 0);
    h.run_all();
    EXPECT_EQ(h.done.at(1).output_ids(), reference(second, 3));
  }
}

TEST(SchedulerTest, AbortFreesBlocksWaitingRunningAndInFlight) {
  Harness h(256, 4, true, config(8));
  h.add(0, make_prompt(30, 0), 10);
  h.add(1, make_prompt(5, 1), 10);
  h.add(2, make_prompt(5, 2), 10);
  h.step();  // 0 takes the whole budget: 1 and 2 wait
  EXPECT_TRUE(h.sched.abort(2));
  EXPECT_FALSE(h.sched.abort(2));
  EXPECT_FALSE(h.sched.abort(42));
  // Abort while a plan is in flight: applied at commit.
  StepPlan plan = h.sched.schedule();
  EXPECT_TRUE(h.sched.abort(0));
  std::vector<SampledToken> sampled;
  for (Sequence* seq : plan.sample_rows) sampled.push_back({next_token(all_tokens(*seq)), {}});
  h.sched.commit(plan, sampled);
  h.kv.check_invariants();
  for (Sequence& s : h.sched.take_finished()) h.done.emplace(s.id(), std::move(s));
  EXPECT_EQ(h.done.at(0).finish_reason(), FinishReason::kAbort);
  EXPECT_EQ(h.done.at(2).finish_reason(), FinishReason::kAbort);
  h.run_all();
  EXPECT_EQ(h.done.at(1).output_ids(), reference(make_prompt(5, 1), 10));
}

TEST(SchedulerTest, FailedStepFinishesItsRequestsWithErrorAndOthersGoOn) {
  Harness h(256, 4, true, config(4096, /*max_seqs=*/2));
  h.add(0, make_prompt(9, 0), 5);
  h.add(1, make_prompt(9, 1), 5);
  h.add(2, make_prompt(9, 2), 5);  // waits: max_num_seqs
  h.step();
  StepPlan plan = h.sched.schedule();
  EXPECT_TRUE(h.sched.abort(2));  // in flight: applied after the failure
  h.sched.fail_step(plan);        // e.g. the forward threw
  h.kv.check_invariants();
  EXPECT_EQ(h.kv.usage().used_blocks, 0);
  for (Sequence& s : h.sched.take_finished()) h.done.emplace(s.id(), std::move(s));
  EXPECT_EQ(h.done.at(0).finish_reason(), FinishReason::kError);
  EXPECT_EQ(h.done.at(1).finish_reason(), FinishReason::kError);
  EXPECT_EQ(h.done.at(2).finish_reason(), FinishReason::kAbort);
  h.add(3, make_prompt(9, 0), 5);  // the scheduler is usable again
  h.run_all();
  EXPECT_EQ(h.done.at(3).output_ids(), reference(make_prompt(9, 0), 5));
}

TEST(SchedulerTest, RandomizedOperationsKeepKvConsistentAndLeakNothing) {
  // Submit (some with deadlines), abort (waiting, mid-prefill, mid-decode),
  // steps with preemptions and prefix-cache hits; invariants after each step.
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    Harness h(24, 4, seed % 2 == 0, config(pick(4, 40), pick(2, 8), 16));
    std::map<int64_t, std::pair<std::vector<int32_t>, int>> requests;
    int64_t next_id = 0;
    auto now = SchedulerClock::now();
    for (int op = 0; op < 3000; ++op) {  // 4 seeds: 12,000 operations
      const int r = pick(0, 9);
      if (r < 4) {
        std::vector<int32_t> prompt = make_prompt(pick(1, 30), pick(0, 3));  // shared prefixes
        const int max_tokens = pick(1, 30);
        RequestOptions opt = prio(pick(0, 2));
        if (pick(0, 4) == 0) opt.deadline = now + std::chrono::milliseconds(pick(0, 40));
        try {
          h.add(next_id, prompt, max_tokens, opt);
          requests[next_id] = {prompt, max_tokens};
        } catch (const Error&) {
          // queue full, or too long for the pool
        }
        ++next_id;
      } else if (r == 4 && next_id > 0) {
        h.sched.abort(pick(0, int(next_id - 1)));
      } else {
        now += std::chrono::milliseconds(1);
        h.step(now);
      }
      for (Sequence& s : h.sched.take_finished()) h.done.emplace(s.id(), std::move(s));
    }
    h.run_all();
    EXPECT_EQ(h.done.size(), requests.size());
    int timeouts = 0;
    for (const auto& [id, s] : h.done) {
      const auto& [prompt, max_tokens] = requests.at(id);
      std::vector<int32_t> expected = reference(prompt, max_tokens);
      if (s.finish_reason() == FinishReason::kAbort || s.finish_reason() == FinishReason::kTimeout) {
        timeouts += s.finish_reason() == FinishReason::kTimeout;
        ASSERT_LE(s.output_ids().size(), expected.size());
        expected.resize(s.output_ids().size());  // cut short, but what it has is right
      } else {
        EXPECT_EQ(s.finish_reason(), FinishReason::kLength);
      }
      EXPECT_EQ(s.output_ids(), expected) << "seed " << seed << " id " << id;
    }
    EXPECT_GT(timeouts, 0) << "seed " << seed;
    EXPECT_GT(h.sched.stats().num_preemptions, 0) << "seed " << seed;
    if (h.kv.prefix_cache_enabled()) {
      EXPECT_GT(h.sched.stats().prefix_hit_tokens, 0);
    }
  }
}

}  // namespace
}  // namespace serval

namespace serval {
namespace {

using namespace sched_testing;

// continue_plan: the step after an in-flight plan, while nothing waits; a row
// that surely ends by length is left out, one that stops at the commit before
// is dropped (from the continuation's commit and from its own continuation).
TEST(SchedulerTest, ContinuePlanContinuesSteadyDecodesOnly) {
  Harness h(64, 4, false, config(4096));
  auto add = [&](int64_t id, int32_t prompt_len, int32_t max_tokens, std::vector<int32_t> stop_tokens) {
    StopCriteria stop;
    stop.max_tokens = max_tokens;
    stop.stop_token_ids = std::move(stop_tokens);
    h.sched.add(Sequence(id, make_prompt(prompt_len, int(id)), SamplingParams{}, stop, h.kv.new_table()));
  };
  add(0, 5, 2, {});     // ends by length at its 2nd token
  add(1, 2, 10, {42});  // stops when it samples 42
  add(2, 3, 10, {});
  auto tokens = [](std::vector<int32_t> ids) {
    std::vector<SampledToken> t;
    for (int32_t id : ids) t.push_back({id, {}});
    return t;
  };
  StepPlan p = h.sched.schedule();
  ASSERT_EQ(p.sample_rows.size(), 3u);
  StepPlan c1 = h.sched.continue_plan(p);
  ASSERT_EQ(c1.items.size(), 3u);
  EXPECT_TRUE(c1.continuation);
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(c1.items[size_t(i)].source_row, i);
  EXPECT_GE(c1.sample_rows[0]->block_table().num_tokens(), 6);  // a slot for position 5
  EXPECT_THROW(h.sched.schedule(), Error);
  EXPECT_THROW(h.sched.continue_plan(c1), Error) << "two plans in flight";
  auto sampled = tokens({7, 42, 7});  // request 1 stops at p's commit
  h.sched.commit(p, sampled);
  std::vector<Sequence> done = h.sched.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id(), 1);
  // c1 still lists request 1 (by key): its continuation leaves it out, and
  // request 0, which reaches max_tokens 2 at c1's commit.
  StepPlan c2 = h.sched.continue_plan(c1);
  ASSERT_EQ(c2.items.size(), 1u);
  EXPECT_EQ(c2.row_keys[0].first, 2);
  EXPECT_EQ(c2.items[0].source_row, 2);
  sampled = tokens({8, 9, 8});  // request 1's 9 is dropped
  h.sched.commit(c1, sampled);
  done = h.sched.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id(), 0);
  EXPECT_EQ(done[0].output_ids(), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(h.sched.find(2)->output_ids(), (std::vector<int32_t>{7, 8}));
  h.sched.abort(2);  // only c2, a continuation, is in flight: at once, and c2 drops its token
  done = h.sched.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].finish_reason(), FinishReason::kAbort);
  EXPECT_EQ(done[0].output_ids(), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(h.kv.usage().used_blocks, 0);
  sampled = tokens({5});
  EXPECT_EQ(h.sched.commit(c2, sampled), 0);

  // A request that waits is admitted into the continuation, after the rows
  // fed from the plan: a prompt chunk of its own tokens.
  add(3, 3, 8, {});
  p = h.sched.schedule();
  add(4, 3, 8, {});
  StepPlan c = h.sched.continue_plan(p);
  ASSERT_EQ(c.items.size(), 2u);
  EXPECT_TRUE(c.items[0].fed());
  EXPECT_EQ(c.items[0].start, 3);
  EXPECT_FALSE(c.items[1].fed());
  EXPECT_EQ(c.item_keys[1].first, 4);
  EXPECT_EQ(c.items[1].start, 0);
  EXPECT_EQ(c.items[1].num_new_tokens, 3);
  ASSERT_EQ(c.row_keys.size(), 2u);
  EXPECT_EQ(c.num_tokens, 4);
  sampled = tokens({1});
  h.sched.commit(p, sampled);
  sampled = tokens({2, 3});
  EXPECT_EQ(h.sched.commit(c, sampled), 2);
  EXPECT_EQ(h.sched.find(3)->output_ids(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(h.sched.find(4)->output_ids(), (std::vector<int32_t>{3}));
  // A row with penalties is not continued (the sampler would not count the fed token) ...
  StopCriteria stop;
  SamplingParams penalized;
  penalized.repetition_penalty = 1.2f;
  h.sched.add(Sequence(5, make_prompt(3, 5), penalized, stop, h.kv.new_table()));
  p = h.sched.schedule();  // admits 5, continues 3 and 4
  EXPECT_TRUE(h.sched.continue_plan(p).empty());

  // ... unless it does.
  SchedulerConfig counting = config(4096);
  counting.fed_penalties = true;
  Harness f(64, 4, false, counting);
  f.sched.add(Sequence(1, make_prompt(3, 1), penalized, stop, f.kv.new_table()));
  p = f.sched.schedule();
  StepPlan c3 = f.sched.continue_plan(p);
  ASSERT_EQ(c3.items.size(), 1u);
  EXPECT_EQ(c3.items[0].source_row, 0);
}

}  // namespace
}  // namespace serval
