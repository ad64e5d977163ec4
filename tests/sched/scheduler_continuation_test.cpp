// Scheduler::continue_plan (async scheduling) under load: plans pipelined as
// the engine runs them. Each plan's Batch is built (BatchBuilder) when it
// starts, i.e. while the plan before it is still in flight, and run later on
// a simulated device, in order: every token's (token, position) goes to its
// slot, a fed token being the one the plan before sampled for its source
// row; each logits row then samples next_token() of its context read back
// through the batch's block table. So a wrong slot, block, copy, start,
// feed or admission changes a request's output, which must equal what it
// gets alone (or a prefix of it, when aborted), with admissions, chunked
// prompts, prefix-cache hits, preemptions (of schedule()), n > 1 forks,
// stop tokens, aborts and deadlines while two plans are in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "engine/batch_builder.h"
#include "scheduler_harness.h"

namespace serval {
namespace {

using namespace sched_testing;

// The device: a KV store of (token, position) per slot, and the tokens the
// plan run last sampled (what the next one's fed tokens read).
struct Device {
  explicit Device(int64_t num_blocks, int32_t block_size)
      : block_size(block_size), store(size_t(num_blocks * block_size), {-1, -1}) {}

  // Runs one started plan: its copies, its K/V writes, then one sample per
  // logits row and one per fork (its parent row's). Returns them.
  std::vector<SampledToken> run(const StepPlan& plan, const Batch& b) {
    for (auto [src, dst] : plan.copies)
      for (int32_t o = 0; o < block_size; ++o)
        store[size_t(dst * block_size + o)] = store[size_t(src * block_size + o)];
    for (int32_t t = 0; t < b.num_tokens(); ++t) {
      const int32_t source = b.token_source.empty() ? -1 : b.token_source[size_t(t)];
      if (source >= int32_t(last.size())) {
        ADD_FAILURE() << "token " << t << " is fed from row " << source << " of a step with " << last.size();
        return {};
      }
      const int32_t token = source >= 0 ? last[size_t(source)] : b.token_ids[size_t(t)];
      store[size_t(b.slot_mapping[size_t(t)])] = {token, b.positions[size_t(t)]};
    }
    std::vector<int32_t> rows;
    for (int32_t s = 0, r = 0; s < b.num_seqs() && r < int32_t(b.logits_rows.size()); ++s) {
      if (b.logits_rows[size_t(r)] != b.query_start[size_t(s) + 1] - 1) continue;
      std::vector<int32_t> context;
      for (int32_t p = 0; p < b.context_len[size_t(s)]; ++p) {
        const int32_t block = b.block_table[size_t(s) * size_t(b.max_blocks_per_seq) + size_t(p / block_size)];
        const auto [token, pos] = store[size_t(block * block_size + p % block_size)];
        EXPECT_EQ(pos, p) << "batch sequence " << s << " reads position " << pos << " at " << p;
        context.push_back(token);
      }
      rows.push_back(next_token(context));
      ++r;
    }
    EXPECT_EQ(rows.size(), b.logits_rows.size());
    std::vector<SampledToken> out;
    for (int32_t t : rows) out.push_back({t, {}});
    for (const StepPlan::Fork& f : plan.forks) out.push_back({rows.at(size_t(f.row)), {}});
    last = rows;
    for (const StepPlan::Fork& f : plan.forks) last.push_back(rows.at(size_t(f.row)));
    return out;
  }

  int32_t block_size;
  std::vector<std::pair<int32_t, int32_t>> store;
  std::vector<int32_t> last;
};

struct Started {
  StepPlan plan;
  Batch batch;
};

struct Request {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  int32_t stop_token = -1;
  int32_t n = 1;
  int deadline_step = -1;  // >= 0: expires at this step of the run's clock (1 ms a step)
  std::vector<int32_t> want() const {
    std::vector<int32_t> out = reference(prompt, max_tokens);
    if (auto it = std::find(out.begin(), out.end(), stop_token); it != out.end()) out.erase(it + 1, out.end());
    return out;
  }
};

// The (id, sample) of a plan's items; a continuation's fed rows may have finished since.
std::vector<std::pair<int64_t, int32_t>> keys_of(const StepPlan& plan) {
  if (plan.continuation) return plan.item_keys;
  std::vector<std::pair<int64_t, int32_t>> keys;
  for (const ScheduledChunk& item : plan.items) keys.emplace_back(item.seq->id(), item.seq->sample_index());
  return keys;
}

struct Counts {
  int steps = 0, continued = 0, admitted_in_continuation = 0, chunk_continued = 0, aborts_in_flight = 0;
  int timeouts = 0;
};

// Runs `requests` (arriving `arrivals_per_step` at a time, random priorities)
// with every plan continued when the scheduler can; checks each output.
Counts run_pipelined(uint32_t seed, int64_t num_blocks, bool prefix_cache, SchedulerConfig config,
                     std::vector<Request> requests, int arrivals_per_step, bool abort_some) {
  std::mt19937 rng(seed);
  const SchedulerClock::time_point t0 = SchedulerClock::now();
  const int32_t bs = 4;
  KvCacheManager kv(num_blocks, bs, prefix_cache);
  Scheduler sched(config, kv);
  BatchBuilder builder(bs);
  Device device(num_blocks, bs);
  Counts n;
  std::map<std::pair<int64_t, int32_t>, Sequence> done;
  std::set<int64_t> aborted;
  size_t next_request = 0;
  auto arrive = [&] {
    for (int i = 0; i < arrivals_per_step && next_request < requests.size(); ++i, ++next_request) {
      const Request& r = requests[next_request];
      StopCriteria stop;
      stop.max_tokens = r.max_tokens;
      if (r.stop_token >= 0) stop.stop_token_ids = {r.stop_token};
      Sequence seq(int64_t(next_request), r.prompt, SamplingParams{}, stop, kv.new_table());
      seq.set_num_samples(r.n);
      RequestOptions options = prio(std::uniform_int_distribution<int>(0, 2)(rng));
      if (r.deadline_step >= 0) options.deadline = t0 + std::chrono::milliseconds(r.deadline_step);
      sched.add(std::move(seq), options);
    }
  };
  auto start = [&](StepPlan plan) {
    Started s;
    s.plan = std::move(plan);
    builder.build(s.plan.items, s.batch);
    s.batch.validate(bs, num_blocks);
    return s;
  };
  std::optional<Started> cur;
  for (int guard = 0; guard < 20000 && (cur || sched.has_unfinished() || next_request < requests.size()); ++guard) {
    const SchedulerClock::time_point now = t0 + std::chrono::milliseconds(n.steps);
    if (!cur) {
      arrive();
      StepPlan plan = sched.schedule(now);
      if (plan.empty()) continue;
      cur = start(std::move(plan));
    }
    // While cur is in flight: requests arrive, then the step after it is planned and started.
    arrive();
    std::optional<Started> next;
    if (StepPlan c = sched.continue_plan(cur->plan, now); !c.empty()) {
      ++n.continued;
      // The continuation's prompt chunks: of a sequence in cur (its next
      // chunk), or admitted.
      const std::vector<std::pair<int64_t, int32_t>> in_cur = keys_of(cur->plan);
      for (size_t i = 0; i < c.items.size(); ++i) {
        if (c.items[i].fed()) continue;
        const bool continues = std::find(in_cur.begin(), in_cur.end(), c.item_keys[i]) != in_cur.end();
        n.chunk_continued += continues;
        n.admitted_in_continuation += !continues;
      }
      next = start(std::move(c));
    }
    std::vector<SampledToken> sampled = device.run(cur->plan, cur->batch);
    // Aborts while two plans are in flight: of a request in cur, or of any
    // arrived one (waiting, mid-prompt, decoding, or in next only).
    if (abort_some && next_request > 0 && std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
      const int64_t id = std::uniform_int_distribution<int>(0, 1)(rng) == 0 && !cur->plan.items.empty()
                             ? keys_of(cur->plan).front().first  // a continuation's sequence may have finished
                             : std::uniform_int_distribution<int64_t>(0, int64_t(next_request) - 1)(rng);
      if (sched.find(id) && sched.abort(id)) {
        aborted.insert(id);
        ++n.aborts_in_flight;
      }
    }
    sched.commit(cur->plan, sampled);
    kv.check_invariants();
    for (Sequence& s : sched.take_finished()) {
      n.timeouts += s.finish_reason() == FinishReason::kTimeout;
      const auto key = std::make_pair(s.id(), s.sample_index());
      done.emplace(key, std::move(s));
    }
    ++n.steps;
    cur = std::move(next);
  }
  EXPECT_FALSE(sched.has_unfinished());
  EXPECT_FALSE(cur.has_value());
  EXPECT_EQ(kv.usage().used_blocks, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<int32_t> want = requests[i].want();
    // A deadline ends every sample left, forked or not yet.
    bool timed_out = false;
    for (int32_t k = 0; k < requests[i].n; ++k) {
      auto it = done.find({int64_t(i), k});
      timed_out |= it != done.end() && it->second.finish_reason() == FinishReason::kTimeout;
    }
    for (int32_t k = 0; k < requests[i].n; ++k) {
      auto it = done.find({int64_t(i), k});
      if (aborted.count(int64_t(i)) || timed_out) {
        if (it == done.end()) continue;  // aborted before it forked
        const std::vector<int32_t>& got = it->second.output_ids();
        EXPECT_LE(got.size(), want.size()) << "request " << i;
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "seed " << seed << " request " << i;
        continue;
      }
      if (it == done.end()) {
        ADD_FAILURE() << "seed " << seed << " request " << i << " sample " << k << " never finished";
        continue;
      }
      EXPECT_EQ(it->second.output_ids(), want) << "seed " << seed << " request " << i << " sample " << k;
    }
  }
  return n;
}

std::vector<Request> random_requests(std::mt19937& rng, int count, bool shared_prefixes) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Request> rs;
  for (int i = 0; i < count; ++i) {
    Request r;
    r.prompt = make_prompt(pick(1, 23), shared_prefixes ? pick(0, 2) : i);
    if (shared_prefixes) r.prompt.push_back(pick(0, kVocab - 1));
    r.max_tokens = pick(1, 20);
    if (pick(0, 3) == 0) {
      const std::vector<int32_t> ref = reference(r.prompt, r.max_tokens);
      r.stop_token = ref[size_t(pick(0, int(ref.size()) - 1))];
    }
    if (pick(0, 9) == 0) r.n = 2;
    if (pick(0, 7) == 0) r.deadline_step = pick(0, 60);
    rs.push_back(std::move(r));
  }
  return rs;
}

TEST(SchedulerContinuationTest, PipelinedStepsGiveEveryRequestItsTokens) {
  Counts total;
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const bool shared = seed % 2 == 0;
    std::vector<Request> requests = random_requests(rng, pick(10, 40), shared);
    // Pools from tight (preemptions, head-of-line waits) to ample; budgets
    // from a few tokens (chunked prompts) to plenty.
    const int64_t blocks = pick(16, 80);
    SchedulerConfig c = config(pick(3, 64), pick(2, 12));
    const Counts n = run_pipelined(seed, blocks, seed % 3 != 0, c, requests, pick(1, 4), seed % 3 == 1);
    total.steps += n.steps;
    total.continued += n.continued;
    total.admitted_in_continuation += n.admitted_in_continuation;
    total.chunk_continued += n.chunk_continued;
    total.aborts_in_flight += n.aborts_in_flight;
    total.timeouts += n.timeouts;
    if (::testing::Test::HasFailure()) break;
  }
  std::cout << "steps " << total.steps << ", continued " << total.continued << ", admissions in a continuation "
            << total.admitted_in_continuation << ", prompt chunks continued " << total.chunk_continued
            << ", aborts in flight " << total.aborts_in_flight << ", timeouts " << total.timeouts << "\n";
  // Every path taken, often.
  EXPECT_GT(total.continued, total.steps / 3) << total.continued << " of " << total.steps;
  EXPECT_GT(total.admitted_in_continuation, 50);
  EXPECT_GT(total.chunk_continued, 20);
  EXPECT_GT(total.aborts_in_flight, 5);
  EXPECT_GT(total.timeouts, 5);
}

// A waiting request whose prompt shares blocks with a prompt the plan in
// flight is computing is not admitted into its continuation (it would
// compute them again), but into the one after, from the prefix cache.
TEST(SchedulerContinuationTest, AdmissionWaitsForBlocksTheFlightIsComputing) {
  Harness h(64, 4, true, config(64));
  const std::vector<int32_t> shared = make_prompt(12, 3);
  auto prompt = [&](int32_t last) {
    std::vector<int32_t> p = shared;
    p.push_back(last);
    return p;
  };
  h.add(0, prompt(1), 5);
  StepPlan p = h.sched.schedule();  // computes request 0's 13 prompt tokens
  h.add(1, prompt(2), 5);
  h.add(2, make_prompt(6, 9), 5);  // shares nothing: could go, but keeps its place behind 1
  StepPlan c1 = h.sched.continue_plan(p);
  ASSERT_EQ(c1.items.size(), 1u);
  EXPECT_TRUE(c1.items[0].fed());
  std::vector<SampledToken> t{{next_token(prompt(1)), {}}};
  h.sched.commit(p, t);
  StepPlan c2 = h.sched.continue_plan(c1);  // p's blocks are cached now
  ASSERT_EQ(c2.items.size(), 3u);
  EXPECT_EQ(c2.item_keys[1].first, 1);
  EXPECT_EQ(c2.items[1].start, 12) << "three blocks from the prefix cache";
  EXPECT_EQ(c2.items[1].num_new_tokens, 1);
  EXPECT_EQ(c2.item_keys[2].first, 2);
  EXPECT_EQ(h.sched.stats().prefix_hit_tokens, 12);
}

// A request of n > 1 samples admitted into a continuation forks there, as
// schedule() would, when its prompt completes; the continuation after it
// feeds each fork from its own spec (after the rows), next to its parent.
TEST(SchedulerContinuationTest, ForksInAContinuation) {
  Harness h(64, 4, false, config(64));
  h.add(0, make_prompt(3, 1), 6);
  StepPlan p = h.sched.schedule();
  StopCriteria stop;
  stop.max_tokens = 4;
  Sequence two(1, make_prompt(6, 2), SamplingParams{}, stop, h.kv.new_table());
  two.set_num_samples(2);
  h.sched.add(std::move(two));
  StepPlan c = h.sched.continue_plan(p);
  ASSERT_EQ(c.items.size(), 2u);
  ASSERT_EQ(c.forks.size(), 1u);
  EXPECT_EQ(c.forks[0].row, 1);
  EXPECT_EQ(c.fork_keys[0], std::make_pair(int64_t(1), int32_t(1)));
  std::vector<SampledToken> t{{5, {}}};
  h.sched.commit(p, t);
  StepPlan c2 = h.sched.continue_plan(c);
  ASSERT_EQ(c2.items.size(), 3u);
  EXPECT_EQ(c2.item_keys[1], std::make_pair(int64_t(1), int32_t(0)));
  EXPECT_EQ(c2.items[1].source_row, 1);
  EXPECT_EQ(c2.item_keys[2], std::make_pair(int64_t(1), int32_t(1)));
  EXPECT_EQ(c2.items[2].source_row, 2) << "the fork's spec";
  EXPECT_EQ(c2.items[2].start, 6);
  t = {{6, {}}, {7, {}}, {8, {}}};
  EXPECT_EQ(h.sched.commit(c, t), 3);
  EXPECT_EQ(h.sched.find(1, 1)->output_ids(), (std::vector<int32_t>{8}));
  EXPECT_EQ(h.sched.find(1, 1)->num_computed_tokens(), 6);
  t = {{1, {}}, {2, {}}, {3, {}}};
  EXPECT_EQ(h.sched.commit(c2, t), 3);
  EXPECT_EQ(h.sched.find(1, 0)->output_ids(), (std::vector<int32_t>{7, 2}));
  EXPECT_EQ(h.sched.find(1, 1)->output_ids(), (std::vector<int32_t>{8, 3}));
}

// A continuation that gives up after taking a slot whose block it shares
// (a fork's parent, copy-on-write) leaves the copy to the next plan.
TEST(SchedulerContinuationTest, CopiesOfAContinuationNotMadeGoToTheNextPlan) {
  Harness h(64, 4, false, config(1));
  StopCriteria stop;
  stop.max_tokens = 4;
  Sequence two(0, make_prompt(3, 2), SamplingParams{}, stop, h.kv.new_table());
  two.set_num_samples(2);
  h.sched.add(std::move(two));
  std::vector<SampledToken> none;
  for (int i = 0; i < 2; ++i) {  // the prompt, one token a step
    StepPlan p = h.sched.schedule();
    ASSERT_TRUE(p.sample_rows.empty());
    h.sched.commit(p, none);
  }
  StepPlan p = h.sched.schedule();
  ASSERT_EQ(p.forks.size(), 1u);
  EXPECT_TRUE(h.sched.continue_plan(p).empty()) << "the budget of 1 token takes the parent only";
  std::vector<SampledToken> t{{5, {}}, {6, {}}};
  h.sched.commit(p, t);
  p = h.sched.schedule();
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.copies.size(), 1u) << "the parent's copy of the shared block, from the continuation";
}

// Out of blocks, a continuation never preempts: there is none, and
// schedule() decides after the commit.
TEST(SchedulerContinuationTest, NoContinuationWithoutBlocks) {
  Harness h(3, 4, false, config(64));
  h.add(0, make_prompt(4, 1), 2);
  h.add(1, make_prompt(4, 2), 2);
  StepPlan p = h.sched.schedule();  // two of the three blocks
  EXPECT_TRUE(h.sched.continue_plan(p).empty()) << "position 4 of both needs two more blocks";
  EXPECT_EQ(h.sched.stats().num_preemptions, 0);
  std::vector<SampledToken> t{{1, {}}, {2, {}}};
  h.sched.commit(p, t);
  p = h.sched.schedule();
  EXPECT_EQ(p.items.size(), 1u);
  EXPECT_EQ(h.sched.stats().num_preemptions, 1);
}

// An abort while a schedule() plan is in flight waits for its commit (the
// plan points at the sequence), and its continuation leaves the sequence
// out; with only a continuation in flight it ends the request at once.
TEST(SchedulerContinuationTest, AbortsWhileInFlight) {
  Harness h(64, 4, false, config(64));
  h.add(0, make_prompt(3, 1), 8);
  h.add(1, make_prompt(3, 2), 8);
  h.add(2, make_prompt(3, 3), 8);
  StepPlan p = h.sched.schedule();
  EXPECT_TRUE(h.sched.abort(1));
  ASSERT_NE(h.sched.find(1), nullptr) << "deferred";
  StepPlan c = h.sched.continue_plan(p);
  ASSERT_EQ(c.items.size(), 2u);
  EXPECT_EQ(c.item_keys[0].first, 0);
  EXPECT_EQ(c.item_keys[1].first, 2);
  EXPECT_EQ(c.items[1].source_row, 2);
  std::vector<SampledToken> t{{4, {}}, {5, {}}, {6, {}}};
  h.sched.commit(p, t);
  std::vector<Sequence> done = h.sched.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].finish_reason(), FinishReason::kAbort);
  EXPECT_EQ(done[0].output_ids(), (std::vector<int32_t>{5}));
  EXPECT_TRUE(h.sched.abort(2));  // only c in flight
  EXPECT_EQ(h.sched.find(2), nullptr);
  StepPlan c2 = h.sched.continue_plan(c);
  ASSERT_EQ(c2.items.size(), 1u);
  EXPECT_EQ(c2.item_keys[0].first, 0);
  t = {{7, {}}, {8, {}}};
  EXPECT_EQ(h.sched.commit(c, t), 1);
  t = {{9, {}}};
  EXPECT_EQ(h.sched.commit(c2, t), 1);
  EXPECT_EQ(h.sched.find(0)->output_ids(), (std::vector<int32_t>{4, 7, 9}));
}

// A deadline that passes while only continuations are in flight ends its
// request at once (waiting or running), as an abort does: the continuation
// goes on without it, and the one in flight drops its token. While a
// schedule() plan is in flight (it points at its sequences), nothing is
// continued: schedule() expires them after that plan's commit.
TEST(SchedulerContinuationTest, DeadlinesWhileInFlight) {
  using std::chrono::milliseconds;
  const auto t0 = SchedulerClock::now();
  Harness h(64, 4, false, config(64));
  h.add(0, make_prompt(3, 1), 8);
  h.add(1, make_prompt(3, 2), 8, deadline(t0 + milliseconds(10)));
  StepPlan p = h.sched.schedule(t0);
  EXPECT_TRUE(h.sched.continue_plan(p, t0 + milliseconds(20)).empty()) << "schedule()'s plan in flight";
  StepPlan c = h.sched.continue_plan(p, t0);
  ASSERT_EQ(c.items.size(), 2u);
  std::vector<SampledToken> t{{4, {}}, {5, {}}};
  h.sched.commit(p, t);
  h.add(2, make_prompt(3, 3), 8, deadline(t0 + milliseconds(15)));  // expires waiting
  StepPlan c2 = h.sched.continue_plan(c, t0 + milliseconds(20));
  EXPECT_EQ(c2.finished, (std::vector<int64_t>{1, 2}));
  ASSERT_EQ(c2.items.size(), 1u);
  EXPECT_EQ(c2.item_keys[0].first, 0);
  std::vector<Sequence> done = h.sched.take_finished();
  ASSERT_EQ(done.size(), 2u);
  for (const Sequence& s : done) EXPECT_EQ(s.finish_reason(), FinishReason::kTimeout);
  EXPECT_EQ(done[0].output_ids(), (std::vector<int32_t>{5}));
  t = {{6, {}}, {7, {}}};
  EXPECT_EQ(h.sched.commit(c, t), 1) << "request 1's token is dropped";
  t = {{8, {}}};
  EXPECT_EQ(h.sched.commit(c2, t), 1);
  EXPECT_EQ(h.sched.find(0)->output_ids(), (std::vector<int32_t>{4, 6, 8}));
  EXPECT_EQ(h.kv.usage().used_blocks, h.sched.find(0)->block_table().num_blocks()) << "1's and 2's blocks are free";
}

}  // namespace
}  // namespace serval
