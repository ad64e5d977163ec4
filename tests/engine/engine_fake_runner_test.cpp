// The Engine over the toy FakeModelRunner (its "KV cache" records which token
// and position each slot holds, so a wrong block table, copy-on-write or
// preemption changes the output or fails a check): greedy equals the toy
// model directly, batched requests equal each alone, n samples equal n
// single requests seeded seed + i, a small pool (preemption) changes nothing,
// EOS / ignore_eos / stop tokens, submit() names what is wrong, and
// submit_all() queues its requests together or not at all.
// (Ported from the former Generator tests; its admission and
// context-capping rules are gone with it.)
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"
#include "model/model_loader.h"

namespace serval {
namespace {

using testing::FakeModelRunner;
using testing::toy_greedy;
using testing::WrappedRunner;

constexpr int64_t kVocab = 97;

// Any tokenizer of at least kVocab tokens: the engine only detokenizes.
const Tokenizer& tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const std::string path = models_dir() + "/stories260K/stories260K.gguf";
    if (!std::filesystem::exists(path)) throw Error(path + " not found (set SERVAL_MODELS)");
    return load_tokenizer(path);
  }();
  return *tok;
}

std::vector<int32_t> iota_prompt(int n, int32_t first) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = (first + 7 * i) % int32_t(kVocab);
  return p;
}

EngineRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  return testing::greedy_request(std::move(prompt), max_tokens);
}

EngineRequest sampled(std::vector<int32_t> prompt, int32_t max_tokens, uint64_t seed, int32_t n = 1) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0.9f;
  r.params.top_k = 20;
  r.params.top_p = 0.9f;
  r.params.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.n = n;
  return r;
}

struct Out {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  RequestTimings timings;
};

// Every sample's output, by index.
std::vector<Out> collect(RequestHandle h, int32_t n = 1) {
  std::vector<Out> out(static_cast<size_t>(n));
  for (int finals = 0; finals < n;) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(20000));
    if (!ev) throw Error("no event within 20 s");
    Out& o = out.at(size_t(ev->index));
    o.tokens.insert(o.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    if (ev->finished()) {
      o.finish = ev->finish;
      o.timings = ev->timings;
      ++finals;
    }
  }
  return out;
}

// Runs requests in one engine, all submitted together; outputs in order.
std::vector<std::vector<Out>> run(ModelRunner& runner, const std::vector<EngineRequest>& requests,
                                  EngineOptions options = {}) {
  Engine engine(runner, tokenizer(), options);
  std::vector<RequestHandle> handles;
  for (const EngineRequest& r : requests) handles.push_back(engine.submit(r));
  std::vector<std::vector<Out>> out;
  for (size_t i = 0; i < handles.size(); ++i) out.push_back(collect(handles[i], requests[i].n));
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  return out;
}

TEST(EngineFakeRunner, GreedyMatchesTheModelDirectly) {
  FakeModelRunner runner(kVocab, 4, 64);
  const auto prompt = iota_prompt(10, 3);
  const auto out = run(runner, {greedy(prompt, 12)});
  EXPECT_EQ(out[0][0].tokens, toy_greedy(prompt, kVocab, 12));
  EXPECT_EQ(out[0][0].finish, FinishReason::kLength);
  // Whole prompt in the first forward, then one token per step; the last
  // sampled token is never fed back.
  ASSERT_EQ(runner.batches.size(), 12u);
  EXPECT_EQ(runner.batches[0].num_tokens(), 10);
  EXPECT_EQ(runner.batches[0].logits_rows, (std::vector<int32_t>{9}));
  for (size_t i = 1; i < runner.batches.size(); ++i) EXPECT_EQ(runner.batches[i].num_tokens(), 1);
  const RequestTimings& t = out[0][0].timings;
  ASSERT_TRUE(t.first_token && t.finish);
  EXPECT_LE(t.arrival, *t.first_token);
  EXPECT_LE(*t.first_token, *t.finish);
}

TEST(EngineFakeRunner, BatchedRequestsMatchEachAlone) {
  const std::vector<EngineRequest> requests = {
      greedy(iota_prompt(5, 1), 9),    sampled(iota_prompt(17, 2), 14, 7),
      greedy(iota_prompt(1, 40), 20),  sampled(iota_prompt(8, 9), 3, 1234),
      sampled(iota_prompt(8, 9), 11, 99)};
  std::vector<std::vector<int32_t>> alone;
  for (const EngineRequest& r : requests) {
    FakeModelRunner runner(kVocab, 4, 64);
    alone.push_back(run(runner, {r})[0][0].tokens);
  }
  EXPECT_EQ(alone[0], toy_greedy(requests[0].prompt_ids, kVocab, 9));
  FakeModelRunner runner(kVocab, 4, 64);
  EngineOptions chunked;
  chunked.scheduler.max_num_batched_tokens = 6;  // chunked prefill mixed with decodes
  const auto together = run(runner, requests, chunked);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(together[i][0].tokens, alone[i]) << "request " << i;
    EXPECT_EQ(int(together[i][0].tokens.size()), requests[i].stop.max_tokens);
  }
}

TEST(EngineFakeRunner, SamplesEqualSingleRequestsSeededSeedPlusIndex) {
  // A 10-token prompt: its last block is partial, so the samples copy it on write.
  const auto prompt = iota_prompt(10, 5);
  FakeModelRunner forked(kVocab, 4, 64);
  const auto samples = run(forked, {sampled(prompt, 15, 40, 4)})[0];
  EXPECT_EQ(forked.copies.size(), 3u);
  // The prompt went through the model once.
  int64_t computed = 0;
  for (const Batch& b : forked.batches) computed += b.num_tokens();
  EXPECT_EQ(computed, 10 + 4 * 14);
  for (int32_t i = 0; i < 4; ++i) {
    FakeModelRunner single(kVocab, 4, 64);
    EXPECT_EQ(samples[size_t(i)].tokens, run(single, {sampled(prompt, 15, 40 + i)})[0][0].tokens)
        << "sample " << i;
  }
}

TEST(EngineFakeRunner, SmallCachePreemptsWithTheSameResults) {
  const std::vector<EngineRequest> requests = {
      greedy(iota_prompt(6, 1), 10), sampled(iota_prompt(9, 5), 7, 3),
      greedy(iota_prompt(3, 8), 12), sampled(iota_prompt(7, 2), 9, 8, 3)};
  FakeModelRunner big(kVocab, 4, 64);
  const auto expected = run(big, requests);
  // 6 blocks of 4 tokens: each sequence alone needs at most 4.
  FakeModelRunner small(kVocab, 4, 6);
  Engine engine(small, tokenizer());
  std::vector<RequestHandle> handles;
  for (const EngineRequest& r : requests) handles.push_back(engine.submit(r));
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto got = collect(handles[i], requests[i].n);
    for (size_t j = 0; j < got.size(); ++j)
      EXPECT_EQ(got[j].tokens, expected[i][j].tokens) << "request " << i << " sample " << j;
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  const std::string m = engine.metrics_registry().expose();
  EXPECT_EQ(m.find("serval:num_preemptions_total{model_name=\"serval\"} 0.0"), std::string::npos)
      << "expected preemptions";
}

TEST(EngineFakeRunner, KvGaugesHoldTheIdlePoolBeforeTheFirstStep) {
  FakeModelRunner runner(kVocab, 4, 64);
  Engine engine(runner, tokenizer());
  const std::string m = engine.metrics_registry().expose();  // no request, no step yet
  auto v = [&m](const std::string& name) { return testing::metric_value(m, name + "{model_name=\"serval\"}"); };
  EXPECT_EQ(v("serval:kv_cache_blocks_free"), 64) << m;
  EXPECT_EQ(v("serval:kv_cache_blocks_used"), 0);
  EXPECT_EQ(v("serval:kv_cache_blocks_cached"), 0);
  EXPECT_EQ(v("serval:kv_cache_usage_perc"), 0);
  EXPECT_EQ(testing::metric_value(m, "serval:cache_config_info{model_name=\"serval\",block_size=\"4\","
                                     "enable_prefix_caching=\"True\",num_gpu_blocks=\"64\"}"),
            1)
      << m;
}

TEST(EngineFakeRunner, StopsAtEosUnlessIgnoredAndAtStopTokens) {
  const auto prompt = iota_prompt(7, 11);
  const auto full = toy_greedy(prompt, kVocab, 30);
  // The first token that does not occur earlier in the output works as EOS at that step.
  size_t k = 2;
  while (std::find(full.begin(), full.begin() + k, full[k]) != full.begin() + k) ++k;
  ASSERT_LT(k, full.size());
  EngineRequest eos = greedy(prompt, 30);
  eos.stop.eos_token_ids = {full[k]};
  EngineRequest ignored = eos;
  ignored.stop.ignore_eos = true;
  EngineRequest stop_token = greedy(prompt, 30);
  stop_token.stop.stop_token_ids = {full[k]};
  stop_token.stop.ignore_eos = true;  // stop tokens still stop
  FakeModelRunner runner(kVocab, 4, 64);
  const auto out = run(runner, {eos, ignored, stop_token});
  const std::vector<int32_t> until_eos(full.begin(), full.begin() + k + 1);
  EXPECT_EQ(out[0][0].tokens, until_eos);  // EOS is part of the output
  EXPECT_EQ(out[0][0].finish, FinishReason::kStop);
  EXPECT_EQ(out[1][0].tokens, full);
  EXPECT_EQ(out[1][0].finish, FinishReason::kLength);
  EXPECT_EQ(out[2][0].tokens, until_eos);
  EXPECT_EQ(out[2][0].finish, FinishReason::kStop);
}

TEST(EngineFakeRunner, FillsTheContextExactly) {
  FakeModelRunner runner(kVocab, 4, 64, /*max_position=*/16);
  const auto out = run(runner, {greedy(iota_prompt(11, 0), 5)});
  EXPECT_EQ(out[0][0].tokens.size(), 5u);
  EXPECT_EQ(out[0][0].finish, FinishReason::kLength);
  for (const Batch& b : runner.batches)
    for (int32_t p : b.positions) EXPECT_LT(p, 16);
}

TEST(EngineFakeRunner, SubmitNamesWhatIsWrong) {
  FakeModelRunner runner(kVocab, 4, 8, /*max_position=*/40);
  Engine engine(runner, tokenizer());
  auto message = [&](const EngineRequest& bad) {
    try {
      engine.submit(bad);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(message(greedy({}, 2)), "the prompt is empty (no tokens)");
  EXPECT_EQ(message(greedy({1, 97}, 2)), "prompt token id 97 is outside the vocabulary [0, 97)");
  EXPECT_EQ(message(greedy(iota_prompt(38, 0), 5)),
            "38 prompt tokens + max_tokens 5 = 43 exceed the model's context of 40 tokens");
  EXPECT_EQ(message(greedy(iota_prompt(30, 0), 5)),
            "30 prompt tokens + max_tokens 5 need 9 KV blocks of 4 tokens but the whole cache has 8; lower max_tokens or "
            "give the KV cache more memory");
  EngineRequest bad_params = greedy({1}, 2);
  bad_params.params.top_p = 2.0f;
  EXPECT_EQ(message(bad_params), "top_p must be in [0, 1], got 2");
  EXPECT_EQ(message(greedy({1}, 0)), "max_tokens must be at least 1, got 0");
  EngineRequest bad_min = greedy({1}, 2);
  bad_min.stop.min_tokens = 3;
  EXPECT_EQ(message(bad_min), "min_tokens must be in [0, max_tokens = 2], got 3");
  EXPECT_EQ(message(sampled({1}, 2, 1, 0)), "n must be in [1, 128], got 0");
  engine.shutdown();
  EXPECT_TRUE(runner.batches.empty());
}

// Holds each forward until the test allows it: the engine loop then sits
// inside a known step.
class GatedRunner : public WrappedRunner {
 public:
  using WrappedRunner::WrappedRunner;
  void forward(const Batch& batch, std::vector<float>& logits) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++calls_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return calls_ <= allowed_; });
    lock.unlock();
    WrappedRunner::forward(batch, logits);
  }
  void allow(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    allowed_ = n;
    cv_.notify_all();
  }
  void wait_for_call(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return calls_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0, allowed_ = 0;
};

// A request submit() accepts is never refused later. The engine counts the
// queue from the step before and its inbox; requests it has moved from the
// inbox into the scheduler's queue during a step must count at once: here
// the queue (2) is full while the second step runs, and a third submit then
// is refused at once. (Before, it was accepted, and the scheduler refused it
// later with an error: a 500 from the server.)
TEST(EngineFakeRunner, AnAcceptedRequestIsNeverRefusedLater) {
  FakeModelRunner fake(kVocab, 4, 256);
  GatedRunner runner(fake);
  EngineOptions options;
  options.scheduler.max_num_seqs = 1;
  options.scheduler.max_queued_requests = 2;
  Engine engine(runner, tokenizer(), options);
  // A failure below must not leave the loop held (the engine's destructor waits for it).
  struct Release {
    GatedRunner& r;
    ~Release() { r.allow(1 << 30); }
  } release{runner};
  RequestHandle a = engine.submit(greedy(iota_prompt(3, 0), 3));
  runner.wait_for_call(1);  // a's first step, held
  RequestHandle b = engine.submit(greedy(iota_prompt(4, 1), 3));
  RequestHandle c = engine.submit(greedy(iota_prompt(5, 2), 3));
  runner.allow(1);
  runner.wait_for_call(2);  // the next step: b and c are in the scheduler's queue now
  EXPECT_THROW(engine.submit(greedy(iota_prompt(6, 3), 3)), QueueFullError);
  runner.allow(1000);
  for (RequestHandle* h : {&a, &b, &c}) EXPECT_EQ(collect(*h)[0].finish, FinishReason::kLength);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

TEST(EngineFakeRunner, SubmitAllQueuesTogetherOrNotAtAll) {
  FakeModelRunner runner(kVocab, 4, 64);
  EngineOptions options;
  options.scheduler.max_queued_requests = 3;
  Engine engine(runner, tokenizer(), options);
  // One bad request: none is queued.
  EXPECT_THROW(engine.submit_all({greedy(iota_prompt(5, 0), 2), greedy({}, 2)}), Error);
  // More than the queue holds: none is queued.
  EXPECT_THROW(engine.submit_all({greedy({1}, 2), greedy({2}, 2), greedy({3}, 2), greedy({4}, 2)}), QueueFullError);
  EXPECT_EQ(engine.num_unfinished(), 0);
  // Queued together: the first step holds all three (submitted one by one,
  // the loop could start a step before the last arrives).
  const std::vector<EngineRequest> requests = {greedy(iota_prompt(5, 0), 3), greedy(iota_prompt(6, 1), 3),
                                               greedy(iota_prompt(7, 2), 3)};
  std::vector<RequestHandle> handles = engine.submit_all(requests);
  ASSERT_EQ(handles.size(), 3u);
  for (size_t i = 0; i < handles.size(); ++i) {
    EXPECT_EQ(collect(handles[i])[0].tokens, toy_greedy(requests[i].prompt_ids, kVocab, 3));
    if (i > 0) {
      EXPECT_GT(handles[i].id(), handles[i - 1].id());
    }
  }
  ASSERT_FALSE(runner.batches.empty());
  EXPECT_EQ(runner.batches[0].num_seqs(), 3);
  EXPECT_EQ(runner.batches[0].num_tokens(), 5 + 6 + 7);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

}  // namespace
}  // namespace serval
