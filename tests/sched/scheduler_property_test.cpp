// Randomized property tests of the scheduler over the paged KV cache, with the
// fake model of scheduler_harness.h (every step reads each sequence's context
// back through its block table, so a wrong block, copy or adoption fails):
//  - no leaks: 10,000 operations per seed of submit / abort (waiting,
//    mid-prefill, mid-decode, while a step is in flight) / steps that finish
//    and preempt requests; after every operation the pool's accounting is
//    consistent and every block's reference count equals the number of live
//    block tables holding it; at the end nothing is referenced;
//  - fragmentation: with random lengths a sequence holds exactly the blocks
//    its tokens need (at most one partially filled block, its last), checked
//    for every live sequence after every step; reports the KV utilization.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "scheduler_harness.h"

namespace serval {
namespace {

using namespace sched_testing;

// Every block's ref count equals the live tables' holdings of it; the pool's
// own recount (check_invariants) covers free + cached + referenced == total.
void check_holdings(const Harness& h, const std::set<int64_t>& live) {
  h.kv.check_invariants();
  std::map<BlockId, int32_t> held;
  for (int64_t id : live)
    if (const Sequence* s = h.sched.find(id))
      for (BlockId b : s->block_table().blocks()) ++held[b];
  int64_t referenced = 0;
  for (BlockId b = 0; b < BlockId(h.kv.num_blocks()); ++b) {
    const int32_t expected = held.count(b) ? held.at(b) : 0;
    ASSERT_EQ(h.kv.pool().ref_count(b), expected) << "block " << b;
    referenced += expected > 0;
  }
  const KvUsage u = h.kv.usage();
  ASSERT_EQ(u.used_blocks, referenced);
  ASSERT_EQ(u.free_blocks + u.cached_blocks + u.used_blocks, u.num_blocks);
}

struct OpCounts {
  int submitted = 0, refused = 0, steps = 0;
  int abort_waiting = 0, abort_mid_prefill = 0, abort_mid_decode = 0, abort_in_flight = 0;
};

TEST(SchedulerPropertyTest, TenThousandRandomOperationsPerSeedLeakNothing) {
  constexpr int kOpsPerSeed = 10000;
  for (uint32_t seed : {11u, 12u, 13u, 14u}) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    // A tight pool (forces preemptions); the prefix cache on for odd seeds.
    Harness h(20, 4, seed % 2 == 1, config(pick(4, 32), pick(2, 6), 12));
    std::map<int64_t, std::pair<std::vector<int32_t>, int>> requests;
    std::set<int64_t> live;
    OpCounts n;
    int64_t next_id = 0;
    auto now = SchedulerClock::now();
    // Live requests in a state, for the abort kinds.
    auto live_where = [&](auto pred) {
      std::vector<int64_t> out;
      for (int64_t id : live)
        if (const Sequence* s = h.sched.find(id); s != nullptr && pred(*s)) out.push_back(id);
      return out;
    };
    auto pick_from = [&](const std::vector<int64_t>& ids) {
      return ids[size_t(pick(0, int(ids.size()) - 1))];
    };
    // Finished requests leave `live` (Harness::step moves them to h.done).
    auto collect = [&] {
      for (Sequence& s : h.sched.take_finished()) h.done.emplace(s.id(), std::move(s));
      std::erase_if(live, [&](int64_t id) { return h.sched.find(id) == nullptr; });
    };
    const bool failed_before = ::testing::Test::HasFailure();
    for (int op = 0; op < kOpsPerSeed; ++op) {
      const int r = pick(0, 19);
      if (r < 6) {
        std::vector<int32_t> prompt = make_prompt(pick(1, 30), pick(0, 3));  // shared prefixes
        const int max_tokens = pick(1, 30);
        RequestOptions opt = prio(pick(0, 2));
        if (pick(0, 9) == 0) opt.deadline = now + std::chrono::milliseconds(pick(0, 40));
        try {
          h.add(next_id, prompt, max_tokens, opt);
          requests[next_id] = {prompt, max_tokens};
          live.insert(next_id);
          ++n.submitted;
        } catch (const Error&) {
          ++n.refused;  // queue full, or too long for the pool
        }
        ++next_id;
      } else if (r == 6) {
        auto ids = live_where([](const Sequence& s) { return s.num_computed_tokens() == 0; });
        if (!ids.empty()) n.abort_waiting += h.sched.abort(pick_from(ids));
      } else if (r == 7) {
        auto ids = live_where([](const Sequence& s) {
          return s.num_computed_tokens() > 0 && !s.prompt_computed();
        });
        if (!ids.empty()) n.abort_mid_prefill += h.sched.abort(pick_from(ids));
      } else if (r == 8) {
        auto ids = live_where([](const Sequence& s) { return s.prompt_computed(); });
        if (!ids.empty()) n.abort_mid_decode += h.sched.abort(pick_from(ids));
      } else if (r == 9 && !live.empty()) {
        // An abort that arrives while the step's forward runs: applied at commit.
        const int64_t victim = pick_from(std::vector<int64_t>(live.begin(), live.end()));
        now += std::chrono::milliseconds(1);
        h.step(now, [&] { n.abort_in_flight += h.sched.abort(victim); });
        ++n.steps;
        EXPECT_EQ(h.sched.find(victim), nullptr);
      } else {
        now += std::chrono::milliseconds(1);
        h.step(now);
        ++n.steps;
      }
      collect();
      check_holdings(h, live);
      if (!failed_before && ::testing::Test::HasFailure()) {
        ADD_FAILURE() << "seed " << seed << " operation " << op;
        return;
      }
    }
    h.run_all();
    collect();
    check_holdings(h, live);
    EXPECT_TRUE(live.empty());
    const KvUsage u = h.kv.usage();
    EXPECT_EQ(u.used_blocks, 0) << "seed " << seed;
    EXPECT_EQ(u.free_blocks + u.cached_blocks, u.num_blocks);

    // Every request finished exactly once, and what it produced is right.
    EXPECT_EQ(h.done.size(), requests.size());
    std::map<FinishReason, int> reasons;
    for (const auto& [id, s] : h.done) {
      ++reasons[s.finish_reason()];
      const auto& [prompt, max_tokens] = requests.at(id);
      std::vector<int32_t> expected = reference(prompt, max_tokens);
      if (s.finish_reason() != FinishReason::kLength) {
        ASSERT_LE(s.output_ids().size(), expected.size());
        expected.resize(s.output_ids().size());  // cut short, but what it has is right
      }
      EXPECT_EQ(s.output_ids(), expected) << "seed " << seed << " id " << id;
    }
    std::cout << "seed " << seed << ": " << kOpsPerSeed << " operations: " << n.submitted
              << " submitted (" << n.refused << " refused), " << n.steps << " steps, "
              << reasons[FinishReason::kLength] << " finished, " << reasons[FinishReason::kTimeout]
              << " timed out, aborted " << n.abort_waiting << " waiting / " << n.abort_mid_prefill
              << " mid-prefill / " << n.abort_mid_decode << " mid-decode / " << n.abort_in_flight
              << " in flight, " << h.sched.stats().num_preemptions << " preemptions, "
              << h.sched.stats().prefix_hit_tokens << " prefix-hit tokens\n";
    // Every kind of operation happened.
    EXPECT_GT(reasons[FinishReason::kLength], 100) << "seed " << seed;
    EXPECT_GT(reasons[FinishReason::kTimeout], 0) << "seed " << seed;
    EXPECT_GT(n.abort_waiting, 0) << "seed " << seed;
    EXPECT_GT(n.abort_mid_prefill, 0) << "seed " << seed;
    EXPECT_GT(n.abort_mid_decode, 0) << "seed " << seed;
    EXPECT_GT(n.abort_in_flight, 0) << "seed " << seed;
    EXPECT_GT(h.sched.stats().num_preemptions, 10) << "seed " << seed;
    if (h.kv.prefix_cache_enabled()) {
      EXPECT_GT(h.sched.stats().prefix_hit_tokens, 0);
    }
  }
}

// After a step, a live sequence's table holds slots for exactly its computed
// tokens (running) or nothing (waiting): ceil(tokens / block_size) blocks.
TEST(SchedulerPropertyTest, AtMostOnePartialBlockPerSequenceAndKvUtilization) {
  constexpr int32_t kBlock = 16;
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Harness h(512, kBlock, /*prefix_cache=*/false, config(256, /*max_seqs=*/32));
  std::set<int64_t> live;
  int64_t next_id = 0;
  double utilization_sum = 0;
  int64_t measured_steps = 0, stored_total = 0, capacity_total = 0;
  for (int step = 0; step < 3000; ++step) {
    // Arrivals with random prompt and output lengths.
    while (h.sched.num_waiting() < 8 && next_id < 400) {
      h.add(next_id, make_prompt(pick(1, 400), pick(0, 9)), pick(1, 300));
      live.insert(next_id++);
    }
    if (!h.sched.has_unfinished()) break;
    h.step();  // moves finished requests to h.done
    std::erase_if(live, [&](int64_t id) { return h.sched.find(id) == nullptr; });
    int64_t stored = 0, running = 0;
    for (int64_t id : live) {
      const Sequence& s = *h.sched.find(id);
      const BlockTable& t = s.block_table();
      ASSERT_EQ(t.num_tokens(), s.num_computed_tokens()) << "seq " << id;
      ASSERT_EQ(t.num_blocks(), (t.num_tokens() + kBlock - 1) / kBlock)
          << "seq " << id << ": " << t.num_blocks() << " blocks for " << t.num_tokens() << " tokens";
      stored += t.num_tokens();
      running += t.num_blocks() > 0;
    }
    const int64_t capacity = h.kv.usage().used_blocks * kBlock;
    // Waste is at most block_size - 1 slots per running sequence.
    ASSERT_LE(capacity - stored, running * (kBlock - 1));
    if (capacity > 0) {
      utilization_sum += double(stored) / double(capacity);
      ++measured_steps;
      stored_total += stored;
      capacity_total += capacity;
    }
  }
  h.run_all();
  EXPECT_EQ(h.done.size(), size_t(next_id));
  ASSERT_GT(measured_steps, 100);
  const double mean = utilization_sum / double(measured_steps);
  // Random lengths of a few hundred tokens: half a block wasted per sequence.
  EXPECT_GT(mean, 0.9);
  std::cout << "KV utilization (tokens stored / capacity of used blocks, block size " << kBlock
            << ", prompts 1..400, outputs 1..300, 32 sequences): mean over " << measured_steps
            << " steps " << mean << ", token-weighted " << double(stored_total) / double(capacity_total)
            << "\n";
  ::testing::Test::RecordProperty("kv_utilization_mean", std::to_string(mean));
}

}  // namespace
}  // namespace serval
