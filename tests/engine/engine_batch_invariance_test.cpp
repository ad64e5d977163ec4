// Acceptance (issue 3): 64 prompts of mixed lengths (3 to ~300 tokens) run
// together through the Engine, greedily, on the real stories260K model and
// the CPU backend, give exactly the tokens each gives alone: for chunk budgets
// 16, 64 and 4096, with the prefix cache on and off, and with a KV pool so
// small that requests are preempted (and recomputed) on the way.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "core/error.h"

#include "engine_test_util.h"

namespace serval {
namespace {

using testing::collect;
using testing::Collected;
using testing::metric_value;

struct Workload {
  std::vector<EngineRequest> requests;
  std::vector<Collected> solo;  // each request run alone
  int64_t max_request_tokens = 0;
};

// Prompts cut from natural text at random offsets (some at offset 0, so they
// share prefixes with each other), a quarter of them only a few tokens long.
const Workload& workload() {
  static const Workload* w = [] {
    auto* w = new Workload;
    const std::vector<int32_t> text = testing::story_tokens(700);
    const int32_t bos = testing::stories_model().tok->bos_id;
    std::mt19937 rng(2026);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    for (int i = 0; i < 64; ++i) {
      const int len = i % 4 == 0 ? pick(2, 8) : pick(9, 300);
      const int offset = i % 3 == 0 ? 0 : pick(0, 390);
      EngineRequest r;
      r.prompt_ids = {bos};
      r.prompt_ids.insert(r.prompt_ids.end(), text.begin() + offset, text.begin() + offset + len);
      r.params.temperature = 0.0f;
      r.stop.max_tokens = pick(4, 24);
      r.stop.eos_token_ids = {testing::stories_model().tok->eos_id};
      w->max_request_tokens = std::max<int64_t>(w->max_request_tokens,
                                                int64_t(r.prompt_ids.size()) + r.stop.max_tokens);
      w->requests.push_back(std::move(r));
    }
    // Alone: a fresh engine without a prefix cache, one request at a time.
    auto runner = testing::stories_runner();
    EngineOptions opts;
    opts.enable_prefix_cache = false;
    Engine engine(*runner, *testing::stories_model().tok, opts);
    // With the top-2 logprobs: how close the nearest greedy tie comes (a
    // difference of rounding between batch shapes could flip only a near-tie).
    float min_margin = 1e9f;
    for (EngineRequest r : w->requests) {
      r.params.logprobs = 2;
      RequestHandle h = engine.submit(r);
      Collected c;
      for (;;) {
        std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(60000));
        if (!ev) throw Error("no event within 60 s");
        c.tokens.insert(c.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
        c.text += ev->text;
        for (const Logprobs& lp : ev->logprobs)
          if (lp.top.size() == 2) min_margin = std::min(min_margin, lp.top[0].logprob - lp.top[1].logprob);
        if (ev->finished()) {
          c.final_event = *ev;
          break;
        }
      }
      w->solo.push_back(std::move(c));
    }
    std::cout << "smallest top-1 / top-2 logprob gap over the solo greedy tokens: " << min_margin
              << "\n";
    return w;
  }();
  return *w;
}

struct RunResult {
  int64_t preemptions = 0;
  int64_t prefix_hits = 0;
};

RunResult run_together(int64_t budget, bool prefix_cache, int64_t kv_cache_tokens) {
  const Workload& w = workload();
  auto runner = testing::stories_runner(kv_cache_tokens);
  EngineOptions opts;
  opts.enable_prefix_cache = prefix_cache;
  opts.check_invariants = true;
  opts.scheduler.max_num_batched_tokens = budget;
  Engine engine(*runner, *testing::stories_model().tok, opts);
  std::vector<RequestHandle> handles;
  for (const EngineRequest& r : w.requests) handles.push_back(engine.submit(r));
  for (size_t i = 0; i < handles.size(); ++i) {
    const Collected c = collect(handles[i]);
    EXPECT_EQ(c.tokens, w.solo[i].tokens)
        << "request " << i << " (" << w.requests[i].prompt_ids.size() << " prompt tokens), budget "
        << budget << ", prefix cache " << prefix_cache << ", pool " << kv_cache_tokens;
    EXPECT_EQ(c.final_event.finish, w.solo[i].final_event.finish) << "request " << i;
    EXPECT_EQ(c.text, w.solo[i].text) << "request " << i;
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
  const std::string m = engine.metrics_registry().expose();
  RunResult r;
  r.preemptions = int64_t(metric_value(m, "serval:num_preemptions_total{model_name=\"serval\"}"));
  r.prefix_hits = int64_t(metric_value(m, "serval:prefix_cache_hits_total{model_name=\"serval\"}"));
  return r;
}

struct Setting {
  int64_t budget;
  bool prefix_cache;
  bool small_pool;
};

class EngineBatchInvariance : public ::testing::TestWithParam<Setting> {};

TEST_P(EngineBatchInvariance, SixtyFourPromptsTogetherEqualSolo) {
  const Setting s = GetParam();
  const Workload& w = workload();
  // Small: room for the longest request and 8 more blocks (of 16 tokens).
  // Big: everything at once.
  const int64_t pool = s.small_pool ? (w.max_request_tokens / 16 + 8) * 16 : 64 * 512;
  const RunResult r = run_together(s.budget, s.prefix_cache, pool);
  if (s.small_pool) {
    EXPECT_GT(r.preemptions, 0) << "the pool of " << pool << " tokens should force preemptions";
  } else {
    EXPECT_EQ(r.preemptions, 0);
  }
  if (s.prefix_cache) {
    EXPECT_GT(r.prefix_hits, 0);  // shared prefixes were reused
  } else {
    EXPECT_EQ(r.prefix_hits, 0);
  }
}

std::string setting_name(const ::testing::TestParamInfo<Setting>& info) {
  const Setting& s = info.param;
  return "budget" + std::to_string(s.budget) + (s.prefix_cache ? "_cache" : "_nocache") +
         (s.small_pool ? "_preempting" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Settings, EngineBatchInvariance,
    ::testing::Values(Setting{16, false, false}, Setting{16, true, false}, Setting{64, false, false},
                      Setting{64, true, false}, Setting{4096, false, false},
                      Setting{4096, true, false}, Setting{16, false, true}, Setting{16, true, true},
                      Setting{64, false, true}, Setting{64, true, true}, Setting{4096, false, true},
                      Setting{4096, true, true}),
    setting_name);

}  // namespace
}  // namespace serval
