// Scheduler with n > 1 samples per request: the prompt is computed once and
// forked, the samples share its KV blocks (copy-on-write of the partial last
// block), each sample's output equals what it gets alone, also through
// chunked prefill and preemption, and abort ends every sample.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "sched/scheduler.h"

namespace serval {
namespace {

constexpr int32_t kVocab = 97;

// The fake sampler: a token that depends on the sequence's tokens and on
// which sample it is, so samples diverge but each is reproducible alone.
int32_t next_token(const std::vector<int32_t>& tokens, int32_t sample) {
  uint64_t h = 1469598103934665603ull ^ uint64_t(sample) * 0x9E3779B97F4A7C15ull;
  for (int32_t t : tokens) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return int32_t(h % kVocab);
}

std::vector<int32_t> reference(std::vector<int32_t> tokens, int max_tokens, int32_t sample) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    out.push_back(next_token(tokens, sample));
    tokens.push_back(out.back());
  }
  return out;
}

std::vector<int32_t> make_prompt(int64_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(int32_t((i * 5 + salt * 11 + 3) % kVocab));
  return p;
}

using Key = std::pair<int64_t, int32_t>;

struct ForkHarness {
  ForkHarness(int64_t num_blocks, int32_t block_size, bool prefix_cache, SchedulerConfig config)
      : kv(num_blocks, block_size, prefix_cache),
        sched(config, kv),
        store(size_t(num_blocks * block_size), {-1, -1}) {}

  void add(int64_t id, std::vector<int32_t> prompt, int max_tokens, int32_t n) {
    StopCriteria stop;
    stop.max_tokens = max_tokens;
    Sequence seq(id, std::move(prompt), SamplingParams{}, stop, kv.new_table());
    seq.set_num_samples(n);
    sched.add(std::move(seq));
  }

  // One step with a shadow KV store: every context position of every
  // scheduled sequence must read back its own token through the block table.
  StepPlan step() {
    StepPlan plan = sched.schedule();
    EXPECT_LE(sched.num_running(), sched.config().max_num_seqs);
    const int32_t bs = kv.block_size();
    for (auto [src, dst] : plan.copies)
      for (int32_t o = 0; o < bs; ++o) store[size_t(dst * bs + o)] = store[size_t(src * bs + o)];
    for (const ScheduledChunk& item : plan.items) {
      const Sequence& seq = *item.seq;
      for (int64_t p = seq.num_computed_tokens(); p < seq.num_computed_tokens() + item.num_new_tokens; ++p)
        store[size_t(seq.block_table().slot(p))] = {seq.token_at(p), int32_t(p)};
    }
    for (const ScheduledChunk& item : plan.items) {
      const Sequence& seq = *item.seq;
      const int64_t end = seq.num_computed_tokens() + item.num_new_tokens;
      for (int64_t p = 0; p < end; ++p) {
        auto [tok, pos] = store[size_t(seq.block_table().slot(p))];
        if (tok != seq.token_at(p) || pos != p) {
          ADD_FAILURE() << "seq " << seq.id() << "/" << seq.sample_index() << " position " << p
                        << " reads token " << tok << " of position " << pos;
          break;
        }
      }
    }
    std::vector<SampledToken> sampled;
    auto tokens_of = [](const Sequence& s) {
      std::vector<int32_t> t = s.prompt_ids();
      t.insert(t.end(), s.output_ids().begin(), s.output_ids().end());
      return t;
    };
    for (Sequence* seq : plan.sample_rows)
      sampled.push_back({next_token(tokens_of(*seq), seq->sample_index()), {}});
    for (const StepPlan::Fork& f : plan.forks) {
      EXPECT_EQ(f.seq->prompt_ids(), plan.sample_rows[size_t(f.row)]->prompt_ids());
      EXPECT_TRUE(f.seq->output_ids().empty());
      sampled.push_back({next_token(tokens_of(*f.seq), f.seq->sample_index()), {}});
    }
    sched.commit(plan, sampled);
    kv.check_invariants();
    for (Sequence& s : sched.take_finished()) done.emplace(Key{s.id(), s.sample_index()}, std::move(s));
    return plan;
  }

  void run_all(int max_steps = 100000) {
    for (int i = 0; i < max_steps && sched.has_unfinished(); ++i) step();
    ASSERT_FALSE(sched.has_unfinished());
    EXPECT_EQ(kv.usage().used_blocks, 0);
  }

  KvCacheManager kv;
  Scheduler sched;
  std::vector<std::pair<int32_t, int32_t>> store;
  std::map<Key, Sequence> done;
};

SchedulerConfig config(int64_t budget, int64_t max_seqs = 256) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  return c;
}

TEST(SchedulerFork, SamplesShareThePromptBlocksAndCopyOnlyThePartialOne) {
  ForkHarness h(64, 4, /*prefix_cache=*/false, config(64));
  const auto prompt = make_prompt(10, 1);  // 2 full blocks + 2 tokens
  h.add(7, prompt, 6, 4);
  StepPlan first = h.step();
  ASSERT_EQ(first.sample_rows.size(), 1u);
  ASSERT_EQ(first.forks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.forks[i].row, 0);
    EXPECT_EQ(first.forks[i].seq->sample_index(), int32_t(i + 1));
  }
  EXPECT_EQ(h.sched.num_running(), 4);
  EXPECT_EQ(h.kv.usage().used_blocks, 3);  // one prompt's worth for 4 samples
  // Each sample appends into the shared partial block: three copy it, the
  // last one left holding it writes in place.
  StepPlan second = h.step();
  EXPECT_EQ(second.copies.size(), 3u);
  EXPECT_EQ(second.items.size(), 4u);
  EXPECT_EQ(h.kv.usage().used_blocks, 2 + 4);  // 4 separate requests: 12
  h.run_all();
  ASSERT_EQ(h.done.size(), 4u);
  std::set<std::vector<int32_t>> distinct;
  for (int32_t i = 0; i < 4; ++i) {
    const Sequence& s = h.done.at(Key{7, i});
    EXPECT_EQ(s.output_ids(), reference(prompt, 6, i)) << "sample " << i;
    EXPECT_EQ(s.finish_reason(), FinishReason::kLength);
    distinct.insert(s.output_ids());
  }
  EXPECT_EQ(distinct.size(), 4u);
}

TEST(SchedulerFork, ForkAfterChunkedPrefillAndFromThePrefixCache) {
  ForkHarness h(64, 4, /*prefix_cache=*/true, config(5));
  const auto prompt = make_prompt(17, 2);
  h.add(1, prompt, 4, 1);
  h.run_all();
  h.add(2, prompt, 5, 3);  // 16 tokens from the cache, 1 computed, then forked
  StepPlan p = h.step();
  EXPECT_EQ(p.num_tokens, 1);
  EXPECT_EQ(p.forks.size(), 2u);
  h.run_all();
  EXPECT_EQ(h.done.at(Key{1, 0}).output_ids(), reference(prompt, 4, 0));
  for (int32_t i = 0; i < 3; ++i)
    EXPECT_EQ(h.done.at(Key{2, i}).output_ids(), reference(prompt, 5, i)) << "sample " << i;
}

TEST(SchedulerFork, PreemptedSamplesRecomputeTheirOwnTokens) {
  for (bool cache : {false, true}) {
    // 12 blocks of 4 tokens for requests of up to 4 samples x (13 + 16 tokens).
    ForkHarness h(12, 4, cache, config(8));
    std::mt19937 rng(5);
    std::map<int64_t, std::pair<std::vector<int32_t>, int>> requests;
    std::map<int64_t, int32_t> samples;
    for (int64_t id = 0; id < 12; ++id) {
      const auto prompt = make_prompt(3 + int64_t(rng() % 11), int32_t(id % 4));
      const int max_tokens = 4 + int(rng() % 13);
      const int32_t n = 1 + int32_t(rng() % 4);
      h.add(id, prompt, max_tokens, n);
      requests[id] = {prompt, max_tokens};
      samples[id] = n;
    }
    h.run_all();
    EXPECT_GT(h.sched.stats().num_preemptions, 0) << "cache " << cache;
    for (auto& [id, r] : requests)
      for (int32_t i = 0; i < samples[id]; ++i) {
        ASSERT_TRUE(h.done.count(Key{id, i})) << id << "/" << i;
        EXPECT_EQ(h.done.at(Key{id, i}).output_ids(), reference(r.first, r.second, i))
            << "request " << id << " sample " << i << " cache " << cache;
      }
  }
}

TEST(SchedulerFork, AbortEndsEverySampleAndFreesTheBlocks) {
  ForkHarness h(64, 4, true, config(4));
  h.add(1, make_prompt(10, 3), 20, 3);
  h.step();  // 4 of 10 prompt tokens: not forked yet
  EXPECT_TRUE(h.sched.abort(1));
  h.step();
  ASSERT_EQ(h.done.size(), 1u);
  EXPECT_EQ(h.done.at(Key{1, 0}).num_pending_forks(), 2);  // the engine ends those too
  EXPECT_EQ(h.done.at(Key{1, 0}).finish_reason(), FinishReason::kAbort);

  h.add(2, make_prompt(6, 4), 20, 3);
  for (int i = 0; i < 4; ++i) h.step();
  EXPECT_EQ(h.sched.num_running(), 3);
  EXPECT_TRUE(h.sched.abort_sample(2, 1));
  h.step();
  EXPECT_EQ(h.done.at(Key{2, 1}).finish_reason(), FinishReason::kAbort);
  EXPECT_EQ(h.sched.num_running(), 2);
  // Abort while a plan is in flight: takes effect at commit, for both samples left.
  StepPlan plan = h.sched.schedule();
  EXPECT_TRUE(h.sched.abort(2));
  std::vector<SampledToken> sampled(plan.sample_rows.size(), SampledToken{5, {}});
  h.sched.commit(plan, sampled);
  for (Sequence& s : h.sched.take_finished()) h.done.emplace(Key{s.id(), s.sample_index()}, std::move(s));
  EXPECT_EQ(h.done.at(Key{2, 0}).finish_reason(), FinishReason::kAbort);
  EXPECT_EQ(h.done.at(Key{2, 2}).finish_reason(), FinishReason::kAbort);
  EXPECT_FALSE(h.sched.has_unfinished());
  EXPECT_EQ(h.kv.usage().used_blocks, 0);
  h.kv.check_invariants();
}

TEST(SchedulerFork, AdmissionReservesSeatsForTheSamples) {
  ForkHarness h(64, 4, false, config(64, /*max_seqs=*/4));
  h.add(1, make_prompt(5, 1), 3, 3);
  h.add(2, make_prompt(5, 2), 3, 2);  // 3 + 2 > 4: waits for seats
  StepPlan p = h.step();
  EXPECT_EQ(p.items.size(), 1u);
  EXPECT_EQ(h.sched.num_running(), 3);
  EXPECT_EQ(h.sched.num_waiting(), 1);
  h.run_all();
  EXPECT_EQ(h.done.size(), 5u);
  // More samples than max_num_seqs: admitted alone.
  h.add(3, make_prompt(5, 3), 2, 6);
  StepPlan alone = h.sched.schedule();
  EXPECT_EQ(alone.forks.size(), 5u);  // running overshoots max_num_seqs, for it only
  std::vector<SampledToken> sampled(6, SampledToken{1, {}});
  h.sched.commit(alone, sampled);
}

TEST(SchedulerFork, FailedStepEndsTheForkedSamples) {
  ForkHarness h(64, 4, false, config(64));
  h.add(1, make_prompt(6, 1), 5, 3);
  StepPlan plan = h.sched.schedule();
  ASSERT_EQ(plan.forks.size(), 2u);
  h.sched.fail_step(plan);
  auto finished = h.sched.take_finished();
  ASSERT_EQ(finished.size(), 3u);
  for (const Sequence& s : finished) EXPECT_EQ(s.finish_reason(), FinishReason::kError);
  EXPECT_EQ(h.kv.usage().used_blocks, 0);
}

}  // namespace
}  // namespace serval
