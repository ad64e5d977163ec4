// Engine with n > 1 samples per request and with min_tokens, on the real CPU
// runner with stories260K: greedy samples equal the n = 1 output (and
// llama2.c's reference), seeded samples differ and reproduce, forked samples
// survive preemption in a small KV pool, abort ends every sample and leaks
// nothing; min_tokens keeps EOS and stop tokens from being sampled early.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "../runtime/stories_golden.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/model_loader.h"

namespace serval {
namespace {

// stories260K from the shared test helpers, with runners of any pool size.
struct Stories {
  const Tokenizer* tok;
  std::unique_ptr<ModelRunner> runner(int64_t kv_cache_tokens = 0) const {
    return testing::stories_runner(kv_cache_tokens);
  }
};
Stories stories() { return Stories{testing::stories_model().tok.get()}; }

std::vector<int32_t> reference_tokens(int n) {
  const auto& ref = testing::stories_reference_ids();
  return std::vector<int32_t>(ref.begin() + 4, ref.begin() + 4 + n);
}

EngineRequest request(int max_tokens, int32_t n, float temperature = 0.0f) {
  EngineRequest r;
  r.prompt_ids = testing::stories_prompt();  // 5 tokens: a partial block to copy on write
  r.params.temperature = temperature;
  r.stop.max_tokens = max_tokens;
  r.n = n;
  return r;
}

struct SampleOut {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  int finals = 0;
};

// Reads a request's events until its channel ends; one entry per sample index.
std::map<int32_t, SampleOut> collect(RequestHandle& h, int32_t n) {
  std::map<int32_t, SampleOut> out;
  int finals = 0;
  while (finals < n) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(20000));
    if (!ev) throw Error("no event within 20 s");
    EXPECT_EQ(ev->request_id, h.id());
    EXPECT_GE(ev->index, 0);
    EXPECT_LT(ev->index, n);
    SampleOut& s = out[ev->index];
    EXPECT_EQ(s.finals, 0) << "event after sample " << ev->index << "'s final one";
    s.tokens.insert(s.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    s.text += ev->text;
    if (ev->finished()) {
      s.finish = ev->finish;
      ++s.finals;
      ++finals;
    }
  }
  EXPECT_FALSE(h.next(std::chrono::milliseconds(1)).has_value()) << "event after the last final";
  return out;
}

TEST(EngineSamples, GreedySamplesEqualTheSingleOutput) {
  auto runner = stories().runner();
  Engine engine(*runner, *stories().tok);
  RequestHandle one = engine.submit(request(40, 1));
  const auto single = collect(one, 1);
  ASSERT_EQ(single.at(0).tokens, reference_tokens(40));
  for (int32_t n : {2, 4}) {
    RequestHandle h = engine.submit(request(40, n));
    const auto samples = collect(h, n);
    ASSERT_EQ(samples.size(), size_t(n));
    for (const auto& [i, s] : samples) {
      EXPECT_EQ(s.tokens, single.at(0).tokens) << "n " << n << " sample " << i;
      EXPECT_EQ(s.text, single.at(0).text);
      EXPECT_EQ(s.finish, FinishReason::kLength);
    }
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

TEST(EngineSamples, SeededSamplesDifferAndReproduce) {
  auto runner = stories().runner();
  Engine engine(*runner, *stories().tok);
  EngineRequest r = request(32, 3, 1.0f);
  r.params.seed = 11;
  RequestHandle a = engine.submit(r);
  RequestHandle b = engine.submit(r);
  const auto sa = collect(a, 3), sb = collect(b, 3);
  std::set<std::vector<int32_t>> distinct;
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sa.at(i).tokens, sb.at(i).tokens) << "sample " << i;
    distinct.insert(sa.at(i).tokens);
  }
  EXPECT_EQ(distinct.size(), 3u);
  // Sample i draws from seed + i: a single request seeded 12 gives sample 1.
  EngineRequest one = request(32, 1, 1.0f);
  one.params.seed = 12;
  RequestHandle c = engine.submit(one);
  EXPECT_EQ(collect(c, 1).at(0).tokens, sa.at(1).tokens);
}

TEST(EngineSamples, ForkedSamplesSurvivePreemption) {
  // 8 blocks of 16 tokens; 3 requests of 4 samples of up to 5 + 60 tokens
  // (4 blocks each) cannot all run: samples get preempted and recomputed.
  auto runner = stories().runner(128);
  ASSERT_EQ(runner->num_blocks(), 8);
  EngineOptions opts;
  opts.scheduler.max_num_batched_tokens = 32;
  Engine engine(*runner, *stories().tok, opts);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 3; ++i) handles.push_back(engine.submit(request(60, 4)));
  for (RequestHandle& h : handles)
    for (const auto& [i, s] : collect(h, 4)) EXPECT_EQ(s.tokens, reference_tokens(60)) << i;
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  const std::string metrics = engine.metrics_registry().expose();
  const std::string name = "serval:num_preemptions_total{model_name=\"serval\"} ";
  const auto at = metrics.find(name);
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GT(std::stod(metrics.substr(at + name.size())), 0.0);
}

using testing::SlowRunner;

TEST(EngineSamples, AbortEndsEverySampleWithoutLeaks) {
  auto inner = stories().runner();
  SlowRunner runner(*inner);
  Engine engine(runner, *stories().tok);
  RequestHandle h = engine.submit(request(400, 3));
  std::optional<RequestEvent> first = h.next(std::chrono::milliseconds(20000));
  ASSERT_TRUE(first.has_value());
  ASSERT_FALSE(first->finished());
  engine.abort(h.id());
  auto rest = collect(h, 3);
  for (const auto& [i, s] : rest) EXPECT_EQ(s.finish, FinishReason::kAbort) << i;
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
  // Aborted before its prompt is computed (never forked): all samples still end.
  RequestHandle early = engine.submit(request(400, 3));
  engine.abort(early.id());
  for (const auto& [i, s] : collect(early, 3)) EXPECT_EQ(s.finish, FinishReason::kAbort) << i;
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

TEST(EngineSamples, StopStringEndsOnlyItsSample) {
  auto runner = stories().runner();
  Engine engine(*runner, *stories().tok);
  EngineRequest plain = request(40, 1);
  RequestHandle h = engine.submit(plain);
  const std::string full = collect(h, 1).at(0).text;
  ASSERT_GT(full.size(), 30u);
  const std::string stop = full.substr(20, 6);
  EngineRequest r = request(40, 2);
  r.stop_strings = {stop};
  RequestHandle h2 = engine.submit(r);
  for (const auto& [i, s] : collect(h2, 2)) {
    EXPECT_EQ(s.text, full.substr(0, full.find(stop))) << i;
    EXPECT_EQ(s.finish, FinishReason::kStop) << i;
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

TEST(EngineSamples, SubmitRefusesBadN) {
  auto runner = stories().runner();
  Engine engine(*runner, *stories().tok);
  EXPECT_THROW(engine.submit(request(4, 0)), Error);
  EXPECT_THROW(engine.submit(request(4, 129)), Error);
}

TEST(EngineMinTokens, EosAndStopTokensAreNotSampledBeforeMinTokens) {
  auto runner = stories().runner();
  Engine engine(*runner, *stories().tok);
  const std::vector<int32_t> greedy = reference_tokens(40);
  // Make the greedy token at output k (first occurrence) an EOS.
  size_t k = 3;
  while (std::find(greedy.begin(), greedy.begin() + k, greedy[k]) != greedy.begin() + k) ++k;
  ASSERT_LT(k, 20u);
  EngineRequest eos = request(40, 1);
  eos.stop.eos_token_ids = {greedy[k]};
  RequestHandle h = engine.submit(eos);
  const auto stopped = collect(h, 1).at(0);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + k + 1));
  EXPECT_EQ(stopped.finish, FinishReason::kStop);

  for (bool as_stop_token : {false, true}) {
    EngineRequest r = request(40, 1);
    if (as_stop_token) r.stop.stop_token_ids = {greedy[k]};
    else r.stop.eos_token_ids = {greedy[k]};
    r.stop.min_tokens = int32_t(k) + 6;
    RequestHandle hm = engine.submit(r);
    const auto out = collect(hm, 1).at(0);
    ASSERT_GE(out.tokens.size(), size_t(r.stop.min_tokens));
    // Up to k the output is the greedy one; at k the banned token is masked,
    // so the next most likely one comes instead.
    EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + k),
              std::vector<int32_t>(greedy.begin(), greedy.begin() + k));
    for (int i = 0; i < r.stop.min_tokens; ++i) EXPECT_NE(out.tokens[size_t(i)], greedy[k]) << i;
  }
  // ignore_eos: EOS is not a stop, so min_tokens does not mask it.
  EngineRequest ign = request(40, 1);
  ign.stop.eos_token_ids = {greedy[k]};
  ign.stop.ignore_eos = true;
  ign.stop.min_tokens = 30;
  RequestHandle hi = engine.submit(ign);
  EXPECT_EQ(collect(hi, 1).at(0).tokens, greedy);
}

}  // namespace
}  // namespace serval
