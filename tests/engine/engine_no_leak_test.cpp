// Acceptance (issue 3), no leaks at the Engine level: a producer thread
// submits hundreds of requests (shared prefixes, random lengths) while an
// aborter thread aborts random ones at random moments (waiting, in prefill,
// decoding, already finished), over a small KV pool that forces preemptions.
// The engine checks the KV cache's invariants after every step
// (EngineOptions::check_invariants); every request ends with exactly one final
// event, what it produced is the toy model's greedy continuation (cut short
// if aborted), and at the end no block is used.
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace serval {
namespace {

using testing::collect;
using testing::Collected;
using testing::FakeModelRunner;

constexpr int64_t kVocab = 64;
constexpr int kRequests = 300;

struct Counts {
  int finished = 0, aborted_before_output = 0, aborted_mid_output = 0;
  double preemptions = 0;
};

Counts run_seed(uint32_t seed, bool speculative = false) {
  std::mt19937 setup(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(setup); };
  FakeModelRunner runner(kVocab, 4, /*num_blocks=*/48);
  EngineOptions opts;
  opts.enable_prefix_cache = seed % 2 == 1;
  opts.check_invariants = true;
  opts.scheduler.max_num_batched_tokens = pick(8, 32);
  opts.scheduler.max_num_seqs = pick(4, 16);
  if (speculative) {
    // The toy model's text rarely repeats: most drafts are rolled back.
    opts.speculative.method = "ngram";
    opts.speculative.num_tokens = pick(1, 8);
  }
  Engine engine(runner, *testing::stories_model().tok, opts);

  std::vector<EngineRequest> requests;
  std::vector<int32_t> shared(64);
  for (int32_t& t : shared) t = pick(0, int(kVocab) - 1);
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    r.prompt_ids.assign(shared.begin(), shared.begin() + pick(0, 40));
    for (int n = pick(1, 24); n > 0; --n) r.prompt_ids.push_back(pick(0, int(kVocab) - 1));
    r.params.temperature = 0.0f;
    r.stop.max_tokens = pick(1, 60);
    requests.push_back(std::move(r));
  }

  std::mutex mutex;
  std::vector<RequestHandle> handles;
  std::atomic<bool> submitted{false};
  std::thread producer([&] {
    std::mt19937 rng(seed * 7 + 1);
    for (size_t i = 0; i < requests.size(); ++i) {
      RequestHandle h = engine.submit(requests[i]);
      {
        std::lock_guard<std::mutex> lock(mutex);
        handles.push_back(h);
      }
      // The first 24 arrive at once, so that the pool is surely oversubscribed
      // (and requests preempted) however fast or slow the machine runs the rest.
      if (i >= 24) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    }
    submitted = true;
  });
  std::thread aborter([&] {
    std::mt19937 rng(seed * 13 + 5);
    // At least 60 aborts, also after the last submission while requests are
    // still decoding: on a slow or busy machine the submission window alone
    // may end before any abort lands mid-output.
    for (int aborts = 0; !submitted || (aborts < 60 && engine.num_unfinished() > 0); ++aborts) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
      int64_t id = -1;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (handles.empty()) continue;
        // Half the time the latest request (likely waiting or in prefill),
        // else any (decoding, or finished already: a no-op).
        id = rng() % 2 ? handles.back().id() : handles[rng() % handles.size()].id();
      }
      engine.abort(id);
    }
  });
  producer.join();
  aborter.join();

  Counts c;
  for (size_t i = 0; i < handles.size(); ++i) {
    const Collected got = collect(handles[i]);
    std::vector<int32_t> expected =
        testing::toy_greedy(requests[i].prompt_ids, kVocab, requests[i].stop.max_tokens);
    if (got.final_event.finish == FinishReason::kAbort) {
      (got.tokens.empty() ? c.aborted_before_output : c.aborted_mid_output) += 1;
      EXPECT_LE(got.tokens.size(), expected.size());
      expected.resize(std::min(expected.size(), got.tokens.size()));
    } else {
      EXPECT_EQ(got.final_event.finish, FinishReason::kLength) << "request " << i;
      ++c.finished;
    }
    EXPECT_EQ(got.tokens, expected) << "seed " << seed << " request " << i;
  }
  EXPECT_EQ(engine.num_unfinished(), 0);
  const KvUsage u = engine.kv_usage();
  EXPECT_EQ(u.used_blocks, 0) << "seed " << seed;
  EXPECT_EQ(u.free_blocks + u.cached_blocks, u.num_blocks);
  c.preemptions = testing::metric_value(engine.metrics_registry().expose(),
                                        "serval:num_preemptions_total{model_name=\"serval\"}");
  return c;
}

TEST(EngineNoLeaks, RandomAbortsFromAnotherThreadLeaveNoBlockUsed) {
  Counts all;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Counts c = run_seed(seed);
    all.finished += c.finished;
    all.aborted_before_output += c.aborted_before_output;
    all.aborted_mid_output += c.aborted_mid_output;
    all.preemptions += c.preemptions;
  }
  std::cout << "finished " << all.finished << ", aborted before any output "
            << all.aborted_before_output << ", aborted mid-output " << all.aborted_mid_output
            << ", preemptions " << all.preemptions << "\n";
  EXPECT_GT(all.finished, 0);
  EXPECT_GT(all.aborted_before_output, 0);
  EXPECT_GT(all.aborted_mid_output, 0);
  EXPECT_GT(all.preemptions, 0);
}

// The same with speculative decoding on: every step's drafts are verified
// and mostly rolled back, over preemptions, aborts and the prefix cache.
TEST(EngineNoLeaks, WithSpeculativeDecodingLeaveNoBlockUsed) {
  Counts all;
  for (uint32_t seed : {4u, 5u}) {
    const Counts c = run_seed(seed, /*speculative=*/true);
    all.finished += c.finished;
    all.aborted_mid_output += c.aborted_mid_output;
    all.preemptions += c.preemptions;
  }
  EXPECT_GT(all.finished, 0);
  EXPECT_GT(all.aborted_mid_output, 0);
  EXPECT_GT(all.preemptions, 0);
}

// The cached-token count on events, on the toy model: a request sharing 5
// full blocks with a finished one reports 20 cached tokens on every event.
TEST(EngineNoLeaks, EventsCarryPromptAndCachedTokenCounts) {
  FakeModelRunner runner(kVocab, 4, 64);
  Engine engine(runner, *testing::stories_model().tok);
  EngineRequest a;
  for (int i = 0; i < 22; ++i) a.prompt_ids.push_back(i % 50 + 3);
  a.params.temperature = 0.0f;
  a.stop.max_tokens = 3;
  RequestHandle ha = engine.submit(a);
  const Collected first = collect(ha);
  EXPECT_EQ(first.final_event.num_prompt_tokens, 22);
  EXPECT_EQ(first.final_event.num_cached_tokens, 0);
  EngineRequest b = a;
  b.prompt_ids.resize(21);  // 5 full blocks shared, the 6th differs in length
  b.prompt_ids.push_back(60);
  RequestHandle hb = engine.submit(b);
  int events = 0;
  for (;;) {
    std::optional<RequestEvent> ev = hb.next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(ev.has_value());
    ++events;
    EXPECT_EQ(ev->num_prompt_tokens, 22);
    EXPECT_EQ(ev->num_cached_tokens, 20);
    if (ev->finished()) break;
  }
  EXPECT_GE(events, 1);
}

}  // namespace
}  // namespace serval
