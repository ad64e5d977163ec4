// Scheduler policies beyond scheduler_test.cpp, with the fake model of
// scheduler_harness.h: static batching (the benchmark's baseline), and no
// starvation when the head of the queue waits for KV blocks while small
// requests keep arriving.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "scheduler_harness.h"

namespace serval {
namespace {

using namespace sched_testing;

// Runs 10 requests of different lengths to the end; returns, per step, whether
// a request was admitted while others were running.
int admissions_while_running(bool static_batching) {
  SchedulerConfig c = config(4096, /*max_seqs=*/4);
  c.static_batching = static_batching;
  Harness h(256, 4, false, c);
  for (int i = 0; i < 10; ++i) h.add(i, make_prompt(3 + i, i), 2 + (i * 5) % 11);
  std::set<int64_t> started;
  int while_running = 0;
  while (h.sched.has_unfinished()) {
    const int64_t running_before = h.sched.num_running();
    h.step();
    for (int64_t id : h.ids)
      if (started.insert(id).second && running_before > 0) ++while_running;
  }
  EXPECT_EQ(started.size(), 10u);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(h.done.at(i).output_ids(), reference(make_prompt(3 + i, i), 2 + (i * 5) % 11)) << i;
  return while_running;
}

TEST(SchedulerPolicyTest, StaticBatchingAdmitsOnlyWhenNothingRuns) {
  EXPECT_EQ(admissions_while_running(/*static_batching=*/true), 0);
  // Continuous batching fills a finished request's slot at once.
  EXPECT_GT(admissions_while_running(/*static_batching=*/false), 0);
}

TEST(SchedulerPolicyTest, StaticBatchingBatchIsWhatOneStepAdmits) {
  SchedulerConfig c = config(4096, /*max_seqs=*/3);
  c.static_batching = true;
  Harness h(256, 4, false, c);
  for (int i = 0; i < 7; ++i) h.add(i, make_prompt(4, i), i == 0 ? 9 : 2);
  h.step();
  EXPECT_EQ(h.ids, (std::vector<int64_t>{0, 1, 2}));
  // 1 and 2 finish at the next step; 0 runs alone until its 9th token.
  for (int s = 0; s < 8; ++s) {
    h.step();
    EXPECT_EQ(h.ids, s == 0 ? (std::vector<int64_t>{0, 1, 2}) : (std::vector<int64_t>{0})) << s;
  }
  EXPECT_EQ(h.sched.num_running(), 0);
  h.step();
  EXPECT_EQ(h.ids, (std::vector<int64_t>{3, 4, 5}));  // the next batch
  h.run_all();
  EXPECT_EQ(h.done.size(), 7u);
}

TEST(SchedulerPolicyTest, StaticBatchingSurvivesPreemption) {
  SchedulerConfig c = config(4096);
  c.static_batching = true;
  Harness h(12, 4, false, c);
  for (int i = 0; i < 8; ++i) h.add(i, make_prompt(2 + i * 2, i), 6 + i * 3);
  h.run_all();
  EXPECT_GT(h.sched.stats().num_preemptions, 0);
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(h.done.at(i).output_ids(), reference(make_prompt(2 + i * 2, i), 6 + i * 3)) << i;
}

TEST(SchedulerPolicyTest, HeadOfQueueWaitingForBlocksIsNotOvertaken) {
  // 16 blocks of 4 tokens. Requests 0 and 1 hold 5 blocks each (7 at the
  // end); request 2 needs 10 blocks for its prompt, so it waits for them
  // while a small request, which would fit, arrives every step. Request 2
  // must be admitted as soon as 0 and 1 have finished, before any later one.
  Harness h(16, 4, false, config(4096));
  h.add(0, make_prompt(20, 0), 8);
  h.add(1, make_prompt(20, 1), 8);
  h.step();  // 0 and 1 admitted: their prompts and first tokens
  h.add(2, make_prompt(40, 2), 3);
  int64_t next_id = 3;
  int admitted_at = -1;
  for (int step = 0; step < 100 && admitted_at < 0; ++step) {
    h.add(next_id, make_prompt(4, int32_t(next_id % 5)), 2);
    ++next_id;
    h.step();
    for (int64_t id : h.ids) {
      if (id == 2) {
        admitted_at = step;
        break;  // later ids of this step were admitted after it
      }
      EXPECT_LT(id, 2) << "request " << id << " overtook request 2 at step " << step;
    }
  }
  // 0 and 1 need 7 more decode steps (0..6); 2 comes at the next one.
  EXPECT_EQ(admitted_at, 7);
  h.run_all();
  EXPECT_EQ(h.done.at(2).output_ids(), reference(make_prompt(40, 2), 3));
}

}  // namespace
}  // namespace serval
