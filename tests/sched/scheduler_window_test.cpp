// Sliding-window KV (SchedulerConfig::kv_window): blocks behind every
// layer's window go back to the pool as a sequence grows, so a long
// generation holds a bounded number of blocks; outputs are unchanged, and
// chunked prefill and preemption still read back their own tokens inside
// the window (the harness checks every read); forks keep their own blocks.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "sched/request_fit.h"
#include "scheduler_harness.h"

namespace serval {
namespace {

using namespace sched_testing;

SchedulerConfig windowed(int64_t budget, int64_t window, int64_t max_seqs = 256) {
  SchedulerConfig c = config(budget, max_seqs);
  c.kv_window = window;
  return c;
}

TEST(SchedulerWindow, ALongGenerationHoldsTheWindowNotTheSequence) {
  Harness h(64, 4, /*prefix_cache=*/false, windowed(16, 8));
  h.add(0, make_prompt(30, 1), 300);  // 330 tokens: 83 blocks without the window, more than the pool
  int64_t most = 0;
  while (h.sched.has_unfinished()) {
    h.step();
    most = std::max(most, h.kv.usage().used_blocks);
  }
  EXPECT_EQ(h.done.at(0).output_ids(), reference(make_prompt(30, 1), 300));
  const KvFitLimits limits{0, 4, 64, 8, 16};
  // Positions from the first new token's window (7 behind it) to the end of a
  // 16-token chunk: 23 tokens, over at most 7 blocks of 4.
  EXPECT_EQ(kv_blocks_held(limits, 330), 7);
  EXPECT_LE(most, kv_blocks_held(limits, 330));
  EXPECT_GE(most, 3);  // the window itself: 8 tokens over 2-3 blocks
  EXPECT_EQ(h.kv.usage().used_blocks, 0);
}

TEST(SchedulerWindow, PreemptionAndChunksStayCorrect) {
  // A pool too small for all at once: sequences preempt and recompute.
  Harness h(9, 4, false, windowed(12, 10, /*max_seqs=*/4));
  for (int i = 0; i < 8; ++i) h.add(i, make_prompt(5 + 7 * i, i), 40 + i);
  h.run_all();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(h.done.at(i).output_ids(), reference(make_prompt(5 + 7 * i, i), 40 + i)) << i;
  EXPECT_GT(h.sched.stats().num_preemptions, 0);
}

TEST(SchedulerWindow, RefusedWithThePrefixCacheAndTooSmallAPool) {
  KvCacheManager kv(16, 4, /*prefix_cache=*/true);
  EXPECT_THROW(Scheduler(windowed(16, 8), kv), Error);
  // A window larger than the pool's tokens: the request needs more blocks than there are.
  Harness h(4, 4, false, windowed(16, 64));
  EXPECT_THROW(h.add(0, make_prompt(40, 1), 60), Error);
}

TEST(KvCacheManagerWindow, ReleaseBeforeFreesWholeBlocksOnceAndForksKeepTheirs) {
  KvCacheManager kv(8, 4);
  BlockTable t = kv.new_table();
  ASSERT_TRUE(kv.allocate_slots(t, 14).has_value());  // blocks 0-3
  BlockTable child = kv.fork(t);
  EXPECT_EQ(kv.release_before(t, 9), 2);  // positions 0-7 are behind: blocks 0 and 1
  EXPECT_EQ(kv.release_before(t, 11), 0);  // block 2 still holds positions 8-11
  EXPECT_EQ(t.num_released_blocks(), 2);
  EXPECT_EQ(t.num_held_blocks(), 2);
  EXPECT_EQ(t.blocks()[0], BlockTable::kReleased);
  EXPECT_THROW((void)t.slot(7), Error);
  EXPECT_NO_THROW((void)t.slot(8));
  EXPECT_EQ(kv.usage().used_blocks, 4);  // the fork still holds all four
  kv.free(child);
  EXPECT_EQ(kv.usage().used_blocks, 2);
  BlockTable grandchild = kv.fork(t);  // shares only what t holds
  kv.free(t);
  kv.free(grandchild);
  EXPECT_EQ(kv.usage().used_blocks, 0);
  kv.check_invariants();
}

}  // namespace
}  // namespace serval
