// The Engine publishes a step's events while the next step runs on the
// runner (start_sample ... finish_sample), and a stop string found that late
// costs one computed row but never a token sent or counted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace serval {
namespace {

using testing::FakeModelRunner;
using testing::metric_value;
using testing::toy_greedy;

constexpr int64_t kVocab = 97;

// Any tokenizer of at least kVocab tokens: the engine only detokenizes.
const Tokenizer& tokenizer() { return *testing::stories_model().tok; }

std::vector<int32_t> prompt_of(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((5 + 11 * i) % kVocab));
  return p;
}

// Step k (from 1) may not finish before the client has read step k - 1's
// event: an engine that published only after committing would wait here.
class PacedRunner : public FakeModelRunner {
 public:
  using FakeModelRunner::FakeModelRunner;
  void start_sample(const Batch& batch, std::span<const SampleSpec> specs) override {
    ++starts;
    FakeModelRunner::start_sample(batch, specs);
  }
  void finish_sample(std::vector<SampleResult>& out) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (events_read.load() < starts.load() - 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        ++late;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    FakeModelRunner::finish_sample(out);
  }

  std::atomic<int> starts{0}, events_read{0}, late{0};
};

TEST(EngineOverlap, PublishesAStepWhileTheNextRuns) {
  PacedRunner runner(kVocab, 4, 64);
  const std::vector<int32_t> prompt = prompt_of(6);
  Engine engine(runner, tokenizer());
  EngineRequest r;
  r.prompt_ids = prompt;
  r.params.temperature = 0;
  r.stop.max_tokens = 8;
  RequestHandle h = engine.submit(r);
  std::vector<int32_t> tokens;
  for (;;) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(ev.has_value());
    EXPECT_LE(ev->token_ids.size(), 1u);  // one event per step
    tokens.insert(tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    ++runner.events_read;
    if (ev->finished()) break;
  }
  EXPECT_EQ(tokens, toy_greedy(prompt, kVocab, 8));
  EXPECT_EQ(runner.starts.load(), 8);
  EXPECT_EQ(runner.late.load(), 0) << "steps finished before the previous step's event was out";
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

TEST(EngineOverlap, StopStringFoundAStepLateSendsAndCountsNothingAfterIt) {
  const std::vector<int32_t> prompt = prompt_of(5);
  const std::vector<int32_t> full = toy_greedy(prompt, kVocab, 24);
  // A token whose one-character text (a printable byte token) is new in the output.
  size_t k = 3;
  std::string text_before, stop;
  for (;; ++k) {
    ASSERT_LT(k, full.size());
    const std::string piece = tokenizer().decode({full[k]});
    text_before = tokenizer().decode(std::vector<int32_t>(full.begin(), full.begin() + long(k)));
    if (piece.size() == 1 && piece[0] > ' ' && text_before.find(piece) == std::string::npos) {
      stop = piece;
      break;
    }
  }
  FakeModelRunner runner(kVocab, 4, 64);
  Engine engine(runner, tokenizer());
  EngineRequest r;
  r.prompt_ids = prompt;
  r.params.temperature = 0;
  r.stop.max_tokens = 24;
  r.stop_strings = {stop};
  RequestHandle h = engine.submit(r);
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  for (;;) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(ev.has_value());
    tokens.insert(tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    text += ev->text;
    if (ev->finished()) {
      finish = ev->finish;
      break;
    }
  }
  EXPECT_EQ(finish, FinishReason::kStop);
  EXPECT_EQ(tokens, std::vector<int32_t>(full.begin(), full.begin() + long(k) + 1));
  EXPECT_EQ(text, text_before);
  // Found while step k + 2 ran: that step computed a row for it, never sent.
  EXPECT_EQ(runner.batches.size(), k + 2);
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  // The request's usage counts the tokens sent; the engine's counter every token computed.
  const std::string m = engine.metrics_registry().expose();
  EXPECT_EQ(metric_value(m, "serval:request_generation_tokens_sum{model_name=\"serval\"}"), double(k + 1)) << m;
  EXPECT_EQ(metric_value(m, "serval:generation_tokens_total{model_name=\"serval\"}"), double(k + 2)) << m;
}

}  // namespace
}  // namespace serval
