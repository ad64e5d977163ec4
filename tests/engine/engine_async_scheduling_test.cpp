// Async scheduling (EngineOptions::async_scheduling): decode steps planned and
// queued while the step before runs, their tokens fed from that step's
// samples (Scheduler::continue_plan, Batch::token_source). On the toy runner,
// whose output depends on every slot, position and block-table entry, every
// request must get the tokens and finish reasons it gets without it: greedy
// and seeded sampling, n = 2, stop tokens that end a row a step before its
// continuation, min_tokens, penalties (the fed token counted), aborts; and the KV
// pool must end empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace serval {
namespace {

using testing::FakeModelRunner;
using testing::toy_greedy;

constexpr int64_t kVocab = 97;

const Tokenizer& tokenizer() { return *testing::stories_model().tok; }

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((5 + 11 * i + 7 * salt) % kVocab));
  return p;
}

EngineOptions async_on() {
  EngineOptions o;
  o.async_scheduling = EngineOptions::AsyncScheduling::kOn;
  o.check_invariants = true;
  return o;
}

// Counts the steps whose tokens were fed from the step before.
class FeedCountingRunner : public FakeModelRunner {
 public:
  using FakeModelRunner::FakeModelRunner;
  void start_sample(const Batch& batch, std::span<const SampleSpec> specs) override {
    if (step_time.count() > 0) std::this_thread::sleep_for(step_time);
    if (!batch.token_source.empty()) ++fed_steps;
    // A fed step that also computes prompt tokens: an admission or a prompt's next chunk.
    if (std::count(batch.token_source.begin(), batch.token_source.end(), -1) > 0) ++mixed_steps;
    FakeModelRunner::start_sample(batch, specs);
  }
  std::atomic<int> fed_steps{0}, mixed_steps{0};
  std::chrono::microseconds step_time{0};
};

// A token the toy model first gives as its kStopAt-th output after `prompt`.
constexpr size_t kStopAt = 3;
int32_t stop_token_at(const std::vector<int32_t>& prompt) {
  const std::vector<int32_t> g = toy_greedy(prompt, kVocab, int(kStopAt));
  EXPECT_EQ(std::find(g.begin(), g.end() - 1, g.back()), g.end() - 1) << "pick another prompt";
  return g.back();
}

std::vector<EngineRequest> workload() {
  std::vector<EngineRequest> rs;
  auto add = [&](int prompt_len, int max_tokens, float temperature) -> EngineRequest& {
    EngineRequest r;
    r.prompt_ids = prompt_of(prompt_len, int(rs.size()));
    r.params.temperature = temperature;
    r.stop.max_tokens = max_tokens;
    rs.push_back(r);
    return rs.back();
  };
  add(6, 14, 0);
  add(1, 9, 0);
  {
    EngineRequest& r = add(5, 12, 0);  // stops at its kStopAt-th token, a step into its continuation
    r.stop.stop_token_ids = {stop_token_at(r.prompt_ids)};
  }
  {
    EngineRequest& r = add(3, 10, 0.9f);
    r.params.seed = 7;
  }
  {
    EngineRequest& r = add(7, 8, 1.0f);
    r.params.seed = 3;
    r.n = 2;
  }
  {
    EngineRequest& r = add(4, 11, 0);  // EOS = its 2nd token, banned for the first 5 outputs
    r.stop.eos_token_ids = {toy_greedy(r.prompt_ids, kVocab, 2)[1]};
    r.stop.min_tokens = 5;
  }
  add(9, 13, 0);
  return rs;
}

using Outcome = std::tuple<std::vector<int32_t>, FinishReason>;

// Every sample's tokens and finish reason, by (request, sample), read from
// the handles of `requests`; then no KV block is left in use.
std::map<std::pair<size_t, int32_t>, Outcome> outcomes(Engine& engine, std::vector<RequestHandle>& hs,
                                                       const std::vector<EngineRequest>& requests) {
  std::map<std::pair<size_t, int32_t>, Outcome> out;
  for (size_t i = 0; i < hs.size(); ++i) {
    for (int32_t left = requests[i].n; left > 0;) {
      std::optional<RequestEvent> ev = hs[i].next(std::chrono::milliseconds(20000));
      if (!ev) {
        ADD_FAILURE() << "request " << i << " timed out";
        return out;
      }
      auto& [tokens, reason] = out[{i, ev->index}];
      tokens.insert(tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
      if (ev->finished()) {
        reason = ev->finish;
        --left;
      }
    }
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  return out;
}

// Every sample's tokens and finish reason, by (request, sample).
std::map<std::pair<size_t, int32_t>, Outcome> run(FakeModelRunner& runner, EngineOptions::AsyncScheduling mode,
                                                  const std::vector<EngineRequest>& requests,
                                                  SchedulerConfig scheduler = {}) {
  EngineOptions o;
  o.scheduler = scheduler;
  o.async_scheduling = mode;
  o.check_invariants = true;
  Engine engine(runner, tokenizer(), o);
  std::vector<RequestHandle> hs = engine.submit_all(requests);
  return outcomes(engine, hs, requests);
}

TEST(EngineAsyncScheduling, ContinuedStepsGiveEveryRequestItsTokens) {
  const std::vector<EngineRequest> requests = workload();
  FeedCountingRunner sync_runner(kVocab, 4, 256), async_runner(kVocab, 4, 256);
  const auto want = run(sync_runner, EngineOptions::AsyncScheduling::kOff, requests);
  const auto got = run(async_runner, EngineOptions::AsyncScheduling::kOn, requests);
  EXPECT_EQ(sync_runner.fed_steps.load(), 0);
  EXPECT_GT(async_runner.fed_steps.load(), 5) << "no step was continued";
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
  // The references themselves: greedy rows follow the toy model.
  EXPECT_EQ(std::get<0>(want.at({0, 0})), toy_greedy(requests[0].prompt_ids, kVocab, 14));
  EXPECT_EQ(std::get<0>(want.at({2, 0})).size(), kStopAt);
  EXPECT_EQ(std::get<1>(want.at({2, 0})), FinishReason::kStop);
  EXPECT_GE(std::get<0>(want.at({5, 0})).size(), 6u);  // its EOS was banned for 5 outputs
}

// More requests than seats, prompts longer than the step's token budget,
// shared prompt prefixes: continued steps admit waiting requests and take
// prompts' next chunks next to the fed decodes.
TEST(EngineAsyncScheduling, ContinuedStepsAdmitAndChunkPrompts) {
  std::vector<EngineRequest> requests;
  for (int round = 0; round < 3; ++round) {
    for (EngineRequest& r : workload()) requests.push_back(r);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int32_t> p = prompt_of(9, 4);  // a shared prefix of two blocks and more
    p.insert(p.end(), requests[i].prompt_ids.begin(), requests[i].prompt_ids.end());
    requests[i].prompt_ids = p;
  }
  // Stop strings on some greedy requests (found a step late, then aborted
  // with a continuation in flight): a printable one-character token text new
  // in the output.
  int with_stop_string = 0;
  for (size_t i = 0; i < requests.size(); i += 2) {
    EngineRequest& r = requests[i];
    if (r.params.temperature != 0 || r.n != 1) continue;
    const std::vector<int32_t> full = toy_greedy(r.prompt_ids, kVocab, int(r.stop.max_tokens));
    for (size_t k = 2; k + 1 < full.size(); ++k) {
      const std::string piece = tokenizer().decode({full[k]});
      const std::string before = tokenizer().decode(std::vector<int32_t>(full.begin(), full.begin() + long(k)));
      if (piece.size() == 1 && piece[0] > ' ' && before.find(piece) == std::string::npos) {
        r.stop_strings = {piece};
        ++with_stop_string;
        break;
      }
    }
  }
  ASSERT_GE(with_stop_string, 3);
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  sc.max_num_batched_tokens = 7;
  FeedCountingRunner sync_runner(kVocab, 4, 256), async_runner(kVocab, 4, 256);
  const auto want = run(sync_runner, EngineOptions::AsyncScheduling::kOff, requests, sc);
  const auto got = run(async_runner, EngineOptions::AsyncScheduling::kOn, requests, sc);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
  EXPECT_GT(async_runner.fed_steps.load(), 20);
  EXPECT_GT(async_runner.mixed_steps.load(), 10);
  int stopped_by_string = 0;
  for (size_t i = 0; i < requests.size(); ++i)
    stopped_by_string += !requests[i].stop_strings.empty() && std::get<1>(want.at({i, 0})) == FinishReason::kStop;
  EXPECT_GE(stopped_by_string, 3);
}

// Random workloads arriving in waves while the engine runs (random budgets,
// seats, shared prefixes, n = 2, seeded sampling, penalties, stop tokens and
// strings, a pool small enough to preempt): every sample's tokens and finish
// reason equal those of the engine without async scheduling.
TEST(EngineAsyncScheduling, RandomWorkloadsArrivingInWaves) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<EngineRequest> requests;
    const std::vector<int32_t> shared = prompt_of(10, int(seed));
    for (int i = 0, n = pick(12, 30); i < n; ++i) {
      EngineRequest r;
      r.prompt_ids = pick(0, 2) == 0 ? shared : std::vector<int32_t>{};
      for (int k = pick(1, 20); k > 0; --k) r.prompt_ids.push_back(int32_t(pick(0, int(kVocab) - 1)));
      r.stop.max_tokens = pick(1, 24);
      r.stop.ignore_eos = true;
      r.params.temperature = 0;
      if (pick(0, 2) == 0) {
        r.params.temperature = 0.8f;
        r.params.seed = pick(0, 1000);
      }
      if (pick(0, 5) == 0) r.n = 2;
      if (pick(0, 4) == 0) r.stop.stop_token_ids = {int32_t(pick(0, int(kVocab) - 1))};
      if (pick(0, 5) == 0) r.stop_strings = {std::string(1, char('a' + pick(0, 25)))};
      if (pick(0, 3) == 0) {
        r.params.frequency_penalty = float(pick(-4, 4)) / 2.0f;
        r.params.repetition_penalty = float(pick(5, 15)) / 10.0f;
      }
      requests.push_back(std::move(r));
    }
    SchedulerConfig sc;
    sc.max_num_seqs = pick(2, 8);
    sc.max_num_batched_tokens = pick(4, 64);
    const int64_t blocks = pick(24, 64);
    std::vector<size_t> waves;  // first request of each wave
    for (size_t i = 0; i < requests.size(); i += size_t(pick(1, 8))) waves.push_back(i);
    auto run_waves = [&](EngineOptions::AsyncScheduling mode, FeedCountingRunner& runner) {
      EngineOptions o;
      o.scheduler = sc;
      o.async_scheduling = mode;
      o.check_invariants = true;
      Engine engine(runner, tokenizer(), o);
      std::vector<RequestHandle> hs;
      for (size_t w = 0; w < waves.size(); ++w) {
        const size_t end = w + 1 < waves.size() ? waves[w + 1] : requests.size();
        std::vector<EngineRequest> wave(requests.begin() + long(waves[w]), requests.begin() + long(end));
        for (RequestHandle& h : engine.submit_all(std::move(wave))) hs.push_back(std::move(h));
        std::this_thread::sleep_for(std::chrono::microseconds(pick(0, 1500)));
      }
      SCOPED_TRACE("seed " + std::to_string(seed));
      return outcomes(engine, hs, requests);
    };
    FeedCountingRunner sync_runner(kVocab, 4, blocks), async_runner(kVocab, 4, blocks);
    const auto want = run_waves(EngineOptions::AsyncScheduling::kOff, sync_runner);
    const auto got = run_waves(EngineOptions::AsyncScheduling::kOn, async_runner);
    EXPECT_EQ(got, want) << "seed " << seed;
    EXPECT_GT(async_runner.fed_steps.load(), 0) << "seed " << seed;
    if (::testing::Test::HasFailure()) break;
  }
}

// Penalties count every output token, the fed one too (the default
// start_sample appends it to the spec's output): penalized rows are
// continued and get the tokens they get without async scheduling. Negative
// penalties make a row repeat its latest token, so a fed token left
// uncounted changes the output.
TEST(EngineAsyncScheduling, PenalizedRowsAreContinued) {
  std::vector<EngineRequest> requests = workload();
  const float penalties[][3] = {{1.3f, 0.4f, 0.3f}, {1.0f, -1.5f, -1.0f}, {0.6f, 0.0f, 0.0f}, {1.0f, 2.0f, 2.0f}};
  for (size_t i = 0; i < requests.size(); ++i) {
    const float(&p)[3] = penalties[i % 4];
    requests[i].params.repetition_penalty = p[0];
    requests[i].params.frequency_penalty = p[1];
    requests[i].params.presence_penalty = p[2];
  }
  FeedCountingRunner sync_runner(kVocab, 4, 256), async_runner(kVocab, 4, 256), plain_runner(kVocab, 4, 256);
  const auto want = run(sync_runner, EngineOptions::AsyncScheduling::kOff, requests);
  EXPECT_EQ(run(async_runner, EngineOptions::AsyncScheduling::kOn, requests), want);
  EXPECT_GT(async_runner.fed_steps.load(), 5) << "no penalized step was continued";
  EXPECT_NE(run(plain_runner, EngineOptions::AsyncScheduling::kOff, workload()), want) << "the penalties do nothing";
}

// A runner whose sampler cannot count a fed token gets no penalized row continued.
TEST(EngineAsyncScheduling, PenalizedRowsWaitForASamplerThatCannotCountFedTokens) {
  class NotCounting : public FeedCountingRunner {
   public:
    using FeedCountingRunner::FeedCountingRunner;
    bool counts_fed_tokens() const override { return false; }
  };
  std::vector<EngineRequest> requests = workload();
  for (EngineRequest& r : requests) r.params.repetition_penalty = 1.3f;
  FeedCountingRunner sync_runner(kVocab, 4, 256);
  NotCounting async_runner(kVocab, 4, 256);
  const auto want = run(sync_runner, EngineOptions::AsyncScheduling::kOff, requests);
  EXPECT_EQ(run(async_runner, EngineOptions::AsyncScheduling::kOn, requests), want);
  EXPECT_EQ(async_runner.fed_steps.load(), 0);
}

// A deadline that passes mid-run ends its request with kTimeout; the others
// keep being continued and get their tokens.
TEST(EngineAsyncScheduling, DeadlinesEndRequestsMidRun) {
  FeedCountingRunner runner(kVocab, 4, 1024);
  runner.step_time = std::chrono::microseconds(300);
  Engine engine(runner, tokenizer(), async_on());
  const EngineRequest r = testing::greedy_request(prompt_of(5, 1), 60, true);
  EngineRequest timed = testing::greedy_request(prompt_of(5, 1), 1000, true);
  timed.options.deadline = SchedulerClock::now() + std::chrono::milliseconds(5);
  RequestHandle a = engine.submit(r), b = engine.submit(timed);
  const testing::Collected cb = testing::collect(b);
  EXPECT_EQ(cb.final_event.finish, FinishReason::kTimeout);
  EXPECT_LT(cb.tokens.size(), 1000u);
  const testing::Collected ca = testing::collect(a);
  EXPECT_EQ(ca.final_event.finish, FinishReason::kLength);
  EXPECT_EQ(ca.tokens, toy_greedy(r.prompt_ids, kVocab, 60));
  EXPECT_GT(runner.fed_steps.load(), 30);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

// Aborts and a shutdown while a continued step is in flight end their requests
// with kAbort, free every block and leave the runner with nothing started
// (a later engine on it works).
TEST(EngineAsyncScheduling, AbortAndShutdownWithAStepInFlight) {
  FeedCountingRunner runner(kVocab, 4, 1024);
  runner.step_time = std::chrono::milliseconds(1);  // b cannot finish its 1,000 tokens before the shutdown
  {
    Engine engine(runner, tokenizer(), async_on());
    const EngineRequest r = testing::greedy_request(prompt_of(5, 1), 1000, true);
    RequestHandle a = engine.submit(r), b = engine.submit(r);
    std::optional<RequestEvent> ev = a.next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(ev.has_value());
    engine.abort(a.id());
    testing::Collected ca = testing::collect(a);
    EXPECT_EQ(ca.final_event.finish, FinishReason::kAbort);
    ev = b.next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(ev.has_value());
    engine.shutdown();
    testing::Collected cb = testing::collect(b);
    EXPECT_EQ(cb.final_event.finish, FinishReason::kAbort);
    EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  }
  EXPECT_GT(runner.fed_steps.load(), 0);
  Engine again(runner, tokenizer(), async_on());
  const EngineRequest r = testing::greedy_request(prompt_of(4, 2), 6, true);
  RequestHandle h = again.submit(r);
  testing::Collected c = testing::collect(h);
  EXPECT_EQ(c.tokens, toy_greedy(r.prompt_ids, kVocab, 6));
}

}  // namespace
}  // namespace serval
