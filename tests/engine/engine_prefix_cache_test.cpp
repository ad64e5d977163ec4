// Acceptance (issue 3), prefix cache through the Engine on stories260K (CPU):
//  - a request that shares a 512-token prefix with a finished one computes
//    only the rest: the tokens the runner computes, the event's cached-token
//    count and the serval:prefix_cache_* counters say so, and its output is
//    the one the same requests give with the cache off;
//  - under pressure (a small pool, many distinct prefixes) cached blocks are
//    evicted and every output still equals the request's solo output.
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace serval {
namespace {

using testing::collect;
using testing::Collected;
using testing::CountingRunner;
using testing::metric_value;

const std::string kLabels = "{model_name=\"serval\"}";

// A fixed number of decode steps.
EngineRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  return testing::greedy_request(std::move(prompt), max_tokens, /*ignore_eos=*/true);
}

struct SharedPrefixRun {
  Collected first, second;
  int64_t first_computed = 0, second_computed = 0;  // tokens through the model
  double hits = 0, queries = 0, prompt_tokens = 0;
};

// A = P + a, run to the end; then B = P + b, where P is 512 tokens.
SharedPrefixRun run_shared_prefix(bool prefix_cache, int64_t budget) {
  const std::vector<int32_t> text = testing::story_tokens(600);
  std::vector<int32_t> a(text.begin(), text.begin() + 512), b = a;
  a.insert(a.end(), text.begin() + 530, text.begin() + 550);  // 20 more
  b.insert(b.end(), text.begin() + 560, text.begin() + 590);  // 30 more
  // The model's context is 512; RoPE goes on past it (the outputs need not
  // make sense, only be the same with and without the cache).
  auto model = testing::stories_runner(4096, /*max_position=*/1024);
  CountingRunner runner(*model);
  EngineOptions opts;
  opts.enable_prefix_cache = prefix_cache;
  opts.check_invariants = true;
  opts.scheduler.max_num_batched_tokens = budget;
  Engine engine(runner, *testing::stories_model().tok, opts);
  SharedPrefixRun r;
  RequestHandle ha = engine.submit(greedy(a, 16));
  r.first = collect(ha);
  r.first_computed = runner.tokens();
  RequestHandle hb = engine.submit(greedy(b, 16));
  r.second = collect(hb);
  r.second_computed = runner.tokens() - r.first_computed;
  const std::string m = engine.metrics_registry().expose();
  r.hits = metric_value(m, "serval:prefix_cache_hits_total" + kLabels);
  r.queries = metric_value(m, "serval:prefix_cache_queries_total" + kLabels);
  r.prompt_tokens = metric_value(m, "serval:prompt_tokens_total" + kLabels);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  return r;
}

TEST(EnginePrefixCache, SharedFiveHundredTwelveTokenPrefixIsNotRecomputed) {
  for (int64_t budget : {64, 2048}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const SharedPrefixRun on = run_shared_prefix(true, budget);
    const SharedPrefixRun off = run_shared_prefix(false, budget);
    // 16 tokens each: the prompt's forward gives the first, 15 decodes the rest.
    ASSERT_EQ(on.second.tokens.size(), 16u);
    EXPECT_EQ(on.first_computed, 532 + 15);
    EXPECT_EQ(on.second_computed, 30 + 15);  // only the 30 tokens after the prefix
    EXPECT_EQ(off.first_computed, 532 + 15);
    EXPECT_EQ(off.second_computed, 542 + 15);
    // The events tell the caller (OpenAI usage.prompt_tokens_details).
    EXPECT_EQ(on.first.final_event.num_prompt_tokens, 532);
    EXPECT_EQ(on.first.final_event.num_cached_tokens, 0);
    EXPECT_EQ(on.second.final_event.num_prompt_tokens, 542);
    EXPECT_EQ(on.second.final_event.num_cached_tokens, 512);
    EXPECT_EQ(off.second.final_event.num_prompt_tokens, 542);
    EXPECT_EQ(off.second.final_event.num_cached_tokens, 0);
    // Metrics: 512 tokens hit out of both prompts looked up.
    EXPECT_EQ(on.hits, 512);
    EXPECT_EQ(on.queries, 532 + 542);
    EXPECT_EQ(on.prompt_tokens, 532 + 30);
    EXPECT_EQ(off.hits, 0);
    EXPECT_EQ(off.prompt_tokens, 532 + 542);
    // Same results as without the cache.
    EXPECT_EQ(on.first.tokens, off.first.tokens);
    EXPECT_EQ(on.second.tokens, off.second.tokens);
    EXPECT_EQ(on.second.text, off.second.text);
  }
}

TEST(EnginePrefixCache, EvictionUnderPressureKeepsOutputsEqualToSolo) {
  // 12 distinct 96-token prefixes (6 blocks each, 72 in all), 3 requests per
  // prefix with their own suffixes, in 3 waves (every other one in reverse
  // order, so the latest cached prefixes come first); the pool has 40 blocks,
  // so cached prefixes are evicted to make room and later waves hit only some.
  // At most 4 requests run at once (8 blocks each): no preemption.
  const std::vector<int32_t> text = testing::story_tokens(700);
  const int32_t bos = testing::stories_model().tok->bos_id;
  std::vector<std::vector<EngineRequest>> waves(3);
  for (int wave = 0; wave < 3; ++wave)
    for (int i = 0; i < 12; ++i) {
      const int p = wave % 2 == 0 ? i : 11 - i;
      std::vector<int32_t> prompt = {bos};
      prompt.insert(prompt.end(), text.begin() + p * 37, text.begin() + p * 37 + 95);
      const int suffix_at = 500 + wave * 40 + p * 3;
      prompt.insert(prompt.end(), text.begin() + suffix_at, text.begin() + suffix_at + 5 + wave * 4);
      waves[size_t(wave)].push_back(greedy(prompt, 12));
    }
  std::vector<std::vector<Collected>> solo(3);
  {
    auto runner = testing::stories_runner();
    EngineOptions opts;
    opts.enable_prefix_cache = false;
    Engine engine(*runner, *testing::stories_model().tok, opts);
    for (int wave = 0; wave < 3; ++wave)
      for (const EngineRequest& r : waves[size_t(wave)]) {
        RequestHandle h = engine.submit(r);
        solo[size_t(wave)].push_back(collect(h));
      }
  }
  auto runner = testing::stories_runner(40 * 16);
  EngineOptions opts;
  opts.check_invariants = true;
  opts.scheduler.max_num_batched_tokens = 128;
  opts.scheduler.max_num_seqs = 4;
  Engine engine(*runner, *testing::stories_model().tok, opts);
  for (int wave = 0; wave < 3; ++wave) {
    std::vector<RequestHandle> handles;
    for (const EngineRequest& r : waves[size_t(wave)]) handles.push_back(engine.submit(r));
    for (size_t i = 0; i < handles.size(); ++i)
      EXPECT_EQ(collect(handles[i]).tokens, solo[size_t(wave)][i].tokens)
          << "wave " << wave << " request " << i;
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  const std::string m = engine.metrics_registry().expose();
  const double hits = metric_value(m, "serval:prefix_cache_hits_total" + kLabels);
  // Some prefixes were found again, but not all: without eviction waves 2 and
  // 3 would hit every one of their 24 prefixes (96 tokens each).
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, 2 * 12 * 96);
  EXPECT_EQ(metric_value(m, "serval:num_preemptions_total" + kLabels), 0);
}

}  // namespace
}  // namespace serval
