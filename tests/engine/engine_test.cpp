// Engine on the real CPU runner with stories260K: greedy output equals
// llama2.c's reference, concurrent submits from several
// threads each equal the solo result, abort frees all KV blocks, stop strings
// cut the text, max_tokens gives "length", metrics count generated tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <sstream>
#include <thread>

#include "../runtime/stories_golden.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/model_loader.h"

namespace serval {
namespace {

// One stories260K runner (default pool) shared by the tests here.
struct Stories {
  std::unique_ptr<ModelRunner> runner;
  const Tokenizer* tok;
};

Stories& stories() {
  static Stories* s = new Stories{testing::stories_runner(), testing::stories_model().tok.get()};
  return *s;
}

constexpr int kTokens = 40;

EngineRequest greedy_request(int max_tokens = kTokens) {
  EngineRequest r;
  r.prompt_ids = testing::stories_prompt();
  r.params.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  return r;
}

using testing::collect;
using testing::Collected;

std::vector<int32_t> reference_tokens(int n) {
  const auto& ref = testing::stories_reference_ids();
  return std::vector<int32_t>(ref.begin() + 4, ref.begin() + 4 + n);
}

TEST(Engine, GreedyMatchesReference) {
  Stories& s = stories();
  Engine engine(*s.runner, *s.tok);
  RequestHandle h = engine.submit(greedy_request());
  Collected c = collect(h);
  EXPECT_EQ(c.tokens, reference_tokens(kTokens));
  EXPECT_EQ(c.final_event.finish, FinishReason::kLength);
  EXPECT_GT(c.events, 1);  // streamed, not one lump
  // The streamed text is the continuation of the prompt's text.
  std::vector<int32_t> all = testing::stories_prompt();
  all.insert(all.end(), c.tokens.begin(), c.tokens.end());
  const std::string prompt_text = s.tok->decode(testing::stories_prompt());
  EXPECT_EQ(prompt_text + c.text, s.tok->decode(all));
  ASSERT_TRUE(c.final_event.timings.first_token && c.final_event.timings.finish);
  EXPECT_LE(c.final_event.timings.arrival, *c.final_event.timings.first_token);
  EXPECT_LE(*c.final_event.timings.first_token, *c.final_event.timings.finish);
}

TEST(Engine, ConcurrentSubmitsFromThreadsEqualSolo) {
  Stories& s = stories();
  EngineOptions opts;
  opts.scheduler.max_num_batched_tokens = 16;  // forces chunked prefill mixed with decodes
  Engine engine(*s.runner, *s.tok, opts);
  const std::vector<int32_t> expected = reference_tokens(kTokens);
  std::vector<Collected> results(16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<RequestHandle> handles;
      for (int i = 0; i < 4; ++i) handles.push_back(engine.submit(greedy_request()));
      for (int i = 0; i < 4; ++i) results[size_t(t * 4 + i)] = collect(handles[size_t(i)]);
    });
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].tokens, expected) << "request " << i;
    EXPECT_EQ(results[i].text, results[0].text);
    EXPECT_EQ(results[i].final_event.finish, FinishReason::kLength);
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

using testing::SlowRunner;

TEST(Engine, AbortMidGenerationFreesBlocks) {
  Stories& s = stories();
  SlowRunner slow(*s.runner);
  Engine engine(slow, *s.tok);
  RequestHandle h = engine.submit(greedy_request(500));
  std::optional<RequestEvent> first = h.next(std::chrono::milliseconds(20000));
  ASSERT_TRUE(first.has_value());
  ASSERT_FALSE(first->finished());
  engine.abort(h.id());
  Collected c = collect(h);
  EXPECT_EQ(c.final_event.finish, FinishReason::kAbort);
  EXPECT_LT(first->token_ids.size() + c.tokens.size(), 500u);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

TEST(Engine, ShutdownAbortsPending) {
  Stories& s = stories();
  auto engine = std::make_unique<Engine>(*s.runner, *s.tok);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 3; ++i) handles.push_back(engine->submit(greedy_request(500)));
  engine->shutdown();
  for (RequestHandle& h : handles) EXPECT_EQ(collect(h).final_event.finish, FinishReason::kAbort);
  EXPECT_THROW(engine->submit(greedy_request()), Error);
  engine.reset();
}

TEST(Engine, StopStringEndsTextBeforeIt) {
  Stories& s = stories();
  Engine engine(*s.runner, *s.tok);
  RequestHandle solo = engine.submit(greedy_request());
  const Collected full = collect(solo);
  ASSERT_GT(full.text.size(), 30u);
  // A stop string that starts mid-text and likely spans tokens.
  const std::string stop = full.text.substr(20, 6);
  const size_t at = full.text.find(stop);
  EngineRequest r = greedy_request();
  r.stop_strings = {stop};
  RequestHandle h = engine.submit(r);
  const Collected c = collect(h);
  EXPECT_EQ(c.final_event.finish, FinishReason::kStop);
  EXPECT_EQ(c.text, full.text.substr(0, at));
  EXPECT_LT(c.tokens.size(), full.tokens.size());
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

TEST(Engine, MaxTokensGivesLengthAndMetricsCountTokens) {
  Stories& s = stories();
  Engine engine(*s.runner, *s.tok);
  RequestHandle h = engine.submit(greedy_request(5));
  const Collected c = collect(h);
  EXPECT_EQ(c.final_event.finish, FinishReason::kLength);
  EXPECT_EQ(c.tokens, reference_tokens(5));
  const std::string text = engine.metrics_registry().expose();
  EXPECT_NE(text.find("serval:generation_tokens_total{model_name=\"serval\"} 5.0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("serval:prompt_tokens_total{model_name=\"serval\"} 5.0\n"),
            std::string::npos);
  EXPECT_NE(text.find("serval:request_success_total{model_name=\"serval\",finished_reason=\"length\"} 1.0"),
            std::string::npos)
      << text;
}

TEST(Engine, SubmitRefusesBadRequests) {
  Stories& s = stories();
  Engine engine(*s.runner, *s.tok);
  EngineRequest bad = greedy_request();
  bad.params.top_p = 1.5f;
  EXPECT_THROW(engine.submit(bad), Error);
  EngineRequest empty = greedy_request();
  empty.prompt_ids.clear();
  EXPECT_THROW(engine.submit(empty), Error);
  EngineRequest too_long = greedy_request(100000);
  EXPECT_THROW(engine.submit(too_long), Error);
  EngineRequest bad_id = greedy_request();
  bad_id.prompt_ids.push_back(1 << 20);
  EXPECT_THROW(engine.submit(bad_id), Error);
  EngineRequest empty_stop = greedy_request();
  empty_stop.stop_strings = {""};
  EXPECT_THROW(engine.submit(empty_stop), Error);
}

TEST(Engine, LogprobsWhenAsked) {
  Stories& s = stories();
  Engine engine(*s.runner, *s.tok);
  EngineRequest r = greedy_request(6);
  r.params.logprobs = 2;
  RequestHandle h = engine.submit(r);
  size_t tokens = 0, logprobs = 0;
  for (;;) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(ev.has_value());
    ASSERT_EQ(ev->logprobs.size(), ev->token_ids.size());
    for (size_t i = 0; i < ev->token_ids.size(); ++i) {
      ASSERT_EQ(ev->logprobs[i].top.size(), 2u);
      EXPECT_EQ(ev->logprobs[i].top[0].token, ev->token_ids[i]);  // greedy: the top token
      EXPECT_EQ(ev->logprobs[i].chosen_rank, 1);
    }
    tokens += ev->token_ids.size();
    logprobs += ev->logprobs.size();
    if (ev->finished()) break;
  }
  EXPECT_EQ(tokens, 6u);
  EXPECT_EQ(logprobs, 6u);
}

// Many requests of mixed lengths, some aborted at random moments from another
// thread: every one ends with exactly one final event, and no block stays used.
TEST(Engine, RandomAbortsNeverLoseARequest) {
  Stories& s = stories();
  EngineOptions opts;
  opts.scheduler.max_num_batched_tokens = 32;
  Engine engine(*s.runner, *s.tok, opts);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 40; ++i) handles.push_back(engine.submit(greedy_request(5 + (i * 7) % 60)));
  std::thread aborter([&] {
    for (int i = 0; i < 40; i += 3) {
      std::this_thread::sleep_for(std::chrono::microseconds(200 * (i % 5)));
      engine.abort(handles[size_t(i)].id());
    }
  });
  int aborted = 0;
  for (RequestHandle& h : handles) {
    const Collected c = collect(h);
    if (c.final_event.finish == FinishReason::kAbort) {
      ++aborted;
    } else {
      EXPECT_EQ(c.final_event.finish, FinishReason::kLength);
      EXPECT_EQ(c.tokens, reference_tokens(int(c.tokens.size())));
    }
  }
  aborter.join();
  EXPECT_LE(aborted, 14);
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

// Delegates to the real runner, but its forward throws while `fail` is set.
class FailingRunner : public testing::WrappedRunner {
 public:
  using WrappedRunner::WrappedRunner;
  void forward(const Batch& batch, std::vector<float>& logits) override {
    if (fail) throw Error("injected forward failure");
    inner_.forward(batch, logits);
  }
  std::atomic<bool> fail{false};
};

TEST(Engine, ForwardFailureGivesErrorEventAndEngineGoesOn) {
  Stories& s = stories();
  FailingRunner runner(*s.runner);
  runner.fail = true;
  Engine engine(runner, *s.tok);
  RequestHandle bad = engine.submit(greedy_request());
  const Collected c = collect(bad);
  EXPECT_EQ(c.final_event.finish, FinishReason::kError);
  EXPECT_NE(c.final_event.error.find("injected forward failure"), std::string::npos);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  runner.fail = false;
  RequestHandle good = engine.submit(greedy_request());
  EXPECT_EQ(collect(good).tokens, reference_tokens(kTokens));
}

TEST(Engine, PastDeadlineFinishesWithTimeout) {
  Stories& s = stories();
  Engine engine(*s.runner, *s.tok);
  EngineRequest r = greedy_request();
  r.options.deadline = SchedulerClock::now() - std::chrono::milliseconds(1);
  RequestHandle h = engine.submit(r);
  const Collected c = collect(h);
  EXPECT_EQ(c.final_event.finish, FinishReason::kTimeout);
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

}  // namespace
}  // namespace serval
