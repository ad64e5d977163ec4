#pragma once
// The scheduler tests' fake model (see scheduler_test.cpp): a shadow KV store
// written at each scheduled slot and read back through the block tables, and
// a "sampler" whose token depends only on the sequence's tokens, so a
// request's output is independent of batching, chunking and preemption.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "sched/scheduler.h"

namespace serval::sched_testing {

constexpr int32_t kVocab = 97;

inline int32_t next_token(const std::vector<int32_t>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return int32_t(h % kVocab);
}

// The continuation a request gets alone.
inline std::vector<int32_t> reference(std::vector<int32_t> prompt, int max_tokens) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    out.push_back(next_token(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

inline std::vector<int32_t> make_prompt(int64_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(int32_t((i * 7 + salt * 13 + 1) % kVocab));
  return p;
}

inline RequestOptions prio(int32_t priority) {
  RequestOptions o;
  o.priority = priority;
  return o;
}

inline RequestOptions deadline(SchedulerClock::time_point t) {
  RequestOptions o;
  o.deadline = t;
  return o;
}

inline std::vector<int32_t> all_tokens(const Sequence& seq) {
  std::vector<int32_t> t = seq.prompt_ids();
  t.insert(t.end(), seq.output_ids().begin(), seq.output_ids().end());
  return t;
}

struct Harness {
  Harness(int64_t num_blocks, int32_t block_size, bool prefix_cache, SchedulerConfig config)
      : kv(num_blocks, block_size, prefix_cache),
        sched(config, kv),
        store(size_t(num_blocks * block_size), {-1, -1}) {}

  void add(int64_t id, std::vector<int32_t> prompt, int max_tokens, RequestOptions opt = {}) {
    StopCriteria stop;
    stop.max_tokens = max_tokens;
    SamplingParams params;
    params.seed = 1;
    sched.add(Sequence(id, std::move(prompt), params, stop, kv.new_table()), opt);
  }

  // One engine step; returns the plan (its sequence pointers are stale
  // afterwards: finished sequences moved out; `ids` lists the items' ids).
  // `in_flight` runs between schedule() and commit(), as if during the forward.
  StepPlan step(SchedulerClock::time_point now = SchedulerClock::now(),
                const std::function<void()>& in_flight = nullptr) {
    StepPlan plan = sched.schedule(now);
    EXPECT_LE(plan.num_tokens, sched.config().max_num_batched_tokens);
    EXPECT_LE(sched.num_running(), sched.config().max_num_seqs);
    const int32_t bs = kv.block_size();
    for (auto [src, dst] : plan.copies)
      for (int32_t o = 0; o < bs; ++o) store[size_t(dst * bs + o)] = store[size_t(src * bs + o)];
    int64_t total = 0;
    ids.clear();
    for (const ScheduledChunk& item : plan.items) {
      ids.push_back(item.seq->id());
      const Sequence& seq = *item.seq;
      EXPECT_GE(item.num_new_tokens, 1);
      total += item.num_new_tokens;
      const int64_t end = seq.num_computed_tokens() + item.num_new_tokens;
      for (int64_t p = seq.num_computed_tokens(); p < end; ++p)
        store[size_t(seq.block_table().slot(p))] = {seq.token_at(p), int32_t(p)};
    }
    // Attention reads: every context position holds this sequence's token
    // (behind a sliding window, every position the first new token's window reads).
    const int64_t window = sched.config().kv_window;
    for (const ScheduledChunk& item : plan.items) {
      const Sequence& seq = *item.seq;
      const int64_t end = seq.num_computed_tokens() + item.num_new_tokens;
      const int64_t first_read = window > 0 ? std::max<int64_t>(0, seq.num_computed_tokens() + 1 - window) : 0;
      // Slots only for this step's tokens: at most one partially filled block.
      EXPECT_EQ(seq.block_table().num_tokens(), end) << "seq " << seq.id();
      EXPECT_EQ(seq.block_table().num_blocks(), (end + bs - 1) / bs) << "seq " << seq.id();
      for (int64_t p = first_read; p < end; ++p) {
        auto [tok, pos] = store[size_t(seq.block_table().slot(p))];
        if (tok != seq.token_at(p) || pos != p) {
          ADD_FAILURE() << "seq " << seq.id() << " position " << p << " reads token " << tok
                        << " of position " << pos << ", expected " << seq.token_at(p);
          break;
        }
      }
    }
    EXPECT_EQ(total, plan.num_tokens);
    // A row with a draft samples at each position, the draft before it
    // included, and keeps the draft while it matches (spec/verify.h).
    std::vector<SampledToken> sampled;
    std::vector<int32_t> accepted;
    for (Sequence* seq : plan.sample_rows) {
      std::vector<int32_t> tokens = all_tokens(*seq);
      const std::vector<int32_t>& draft = seq->draft_ids();
      int32_t kept = 1;
      for (size_t j = 0; j <= draft.size(); ++j) {
        sampled.push_back({next_token(tokens), {}});
        if (j == draft.size()) break;
        if (kept == int32_t(j) + 1 && sampled.back().token == draft[j]) ++kept;
        tokens.push_back(draft[j]);
      }
      accepted.push_back(kept);
      draft_tokens += int64_t(draft.size());
      accepted_tokens += kept - 1;
    }
    if (in_flight) in_flight();
    sched.commit(plan, sampled, accepted);
    kv.check_invariants();
    for (Sequence& s : sched.take_finished()) done.emplace(s.id(), std::move(s));
    ++steps;
    return plan;
  }

  void run_all(int max_steps = 100000) {
    for (int i = 0; i < max_steps && sched.has_unfinished(); ++i) step();
    ASSERT_FALSE(sched.has_unfinished());
    EXPECT_EQ(kv.usage().used_blocks, 0);
  }

  KvCacheManager kv;
  Scheduler sched;
  std::vector<std::pair<int32_t, int32_t>> store;  // slot -> (token, position)
  std::map<int64_t, Sequence> done;
  std::vector<int64_t> ids;  // the last step's items
  int steps = 0;
  int64_t draft_tokens = 0, accepted_tokens = 0;  // with a drafter (Scheduler::set_drafter)
};

inline SchedulerConfig config(int64_t budget, int64_t max_seqs = 256, int64_t max_queue = 4096) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_queued_requests = max_queue;
  return c;
}

}  // namespace serval::sched_testing
