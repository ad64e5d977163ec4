// Prompt logprobs (SamplingParams::prompt_logprobs) through the Engine on a
// tiny random model, against the double-precision reference forward pass:
// every prompt token's logprob, rank and top n, whatever cuts the prompt
// (chunked prefill, few scored rows a step, async scheduling), with n > 1,
// after a prefix-cache hit was possible, and two scored prompts in one step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../runtime/tiny_model.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"

namespace serval {
namespace {

const Tokenizer& stories_tokenizer() { return *testing::stories_model().tok; }

struct Tiny {
  testing::TinySpec spec;
  ModelConfig cfg;
  WeightStore weights;
  Tiny() {
    spec.seed = 11;
    cfg = testing::tiny_config(spec);
    weights = testing::tiny_weights(cfg, spec);
  }
  std::unique_ptr<ModelRunner> runner(int32_t max_scored_rows) const {
    RunnerOptions o;
    o.block_size = 4;
    o.kv_cache_tokens = 256;
    o.threads = 2;
    o.max_scored_rows = max_scored_rows;
    return ModelRunner::create(cfg, weights, o);
  }
  std::vector<int32_t> prompt(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(cfg.vocab_size));
    return t;
  }
};

// What the events of one sample carried.
struct SampleOut {
  std::vector<std::optional<Logprobs>> prompt_logprobs;
  int prompt_logprob_events = 0;  // events that carried them (must be one)
  std::vector<int32_t> tokens;
  int32_t cached = 0;
};

std::vector<std::vector<SampleOut>> run(ModelRunner& runner, const EngineOptions& opts,
                                        const std::vector<EngineRequest>& requests, bool one_by_one = false) {
  Engine engine(runner, stories_tokenizer(), opts);
  std::vector<std::vector<SampleOut>> out;
  std::vector<RequestHandle> handles;
  auto read = [&](RequestHandle& h, int32_t n) {
    std::vector<SampleOut> samples(static_cast<size_t>(n));
    for (int finals = 0; finals < n;) {
      std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(60000));
      if (!ev) throw Error("no event within 60 s");
      SampleOut& s = samples.at(size_t(ev->index));
      if (!ev->prompt_logprobs.empty()) {
        s.prompt_logprobs = ev->prompt_logprobs;
        ++s.prompt_logprob_events;
      }
      s.tokens.insert(s.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
      s.cached = std::max(s.cached, ev->num_cached_tokens);
      if (ev->finished()) {
        EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
        ++finals;
      }
    }
    return samples;
  };
  if (one_by_one) {
    for (const EngineRequest& r : requests) {
      RequestHandle h = engine.submit(r);
      out.push_back(read(h, r.n));
    }
  } else {
    handles = engine.submit_all(requests);
    for (size_t i = 0; i < handles.size(); ++i) out.push_back(read(handles[i], requests[i].n));
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  return out;
}

EngineRequest scored_request(std::vector<int32_t> prompt, int32_t top_n, int32_t n = 1) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0.0f;
  r.params.prompt_logprobs = top_n;
  r.stop.max_tokens = 3;
  r.stop.ignore_eos = true;
  r.n = n;
  return r;
}

// The scores equal the reference's log-softmax at each prompt position.
void expect_reference(const Tiny& tiny, const std::vector<int32_t>& prompt, int32_t top_n, const SampleOut& got) {
  ASSERT_EQ(got.prompt_logprob_events, 1);
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(got.prompt_logprobs[0].has_value());
  const auto logits = testing::reference_logits(tiny.cfg, tiny.weights, prompt);
  for (size_t p = 1; p < prompt.size(); ++p) {
    ASSERT_TRUE(got.prompt_logprobs[p].has_value()) << "position " << p;
    const Logprobs& lp = *got.prompt_logprobs[p];
    const std::vector<double>& row = logits[p - 1];
    double lse = 0, mx = *std::max_element(row.begin(), row.end());
    for (double v : row) lse += std::exp(v - mx);
    lse = mx + std::log(lse);
    const double want = row[size_t(prompt[p])] - lse;
    EXPECT_NEAR(lp.chosen, want, 1e-4) << "position " << p;
    int32_t rank = 1;
    for (double v : row) rank += v > row[size_t(prompt[p])];
    EXPECT_EQ(lp.chosen_rank, rank) << "position " << p;
    std::vector<int32_t> order(row.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
    ASSERT_EQ(lp.top.size(), size_t(top_n)) << "position " << p;
    for (int32_t k = 0; k < top_n; ++k) {
      EXPECT_EQ(lp.top[size_t(k)].token, order[size_t(k)]) << "position " << p << " rank " << k;
      EXPECT_NEAR(lp.top[size_t(k)].logprob, row[size_t(order[size_t(k)])] - lse, 1e-4);
    }
  }
}

struct Case {
  const char* name;
  int64_t batched_tokens;
  int32_t scored_rows;
  bool async;
};

TEST(EnginePromptLogprobs, EqualTheReferenceHoweverThePromptIsCut) {
  const Tiny tiny;
  const Case cases[] = {
      {"whole", 512, 256, false},
      {"chunked prefill", 7, 256, false},
      {"5 scored rows a step", 512, 5, false},
      {"both, async scheduling", 6, 4, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto runner = tiny.runner(c.scored_rows);
    EngineOptions o;
    o.scheduler.max_num_batched_tokens = c.batched_tokens;
    o.async_scheduling = c.async ? EngineOptions::AsyncScheduling::kOn : EngineOptions::AsyncScheduling::kOff;
    const std::vector<int32_t> a = tiny.prompt(29, 1), b = tiny.prompt(17, 2), one = tiny.prompt(1, 3);
    EngineRequest plain = scored_request(tiny.prompt(9, 4), 0);
    plain.params.prompt_logprobs = -1;
    // Two scored prompts in the same steps, one of a single token, one not scored.
    const auto out = run(*runner, o, {scored_request(a, 3), scored_request(b, 0), scored_request(one, 2), plain});
    expect_reference(tiny, a, 3, out[0][0]);
    expect_reference(tiny, b, 0, out[1][0]);
    ASSERT_EQ(out[2][0].prompt_logprobs.size(), 1u);
    EXPECT_FALSE(out[2][0].prompt_logprobs[0].has_value());
    EXPECT_EQ(out[3][0].prompt_logprob_events, 0);
    for (const auto& r : out) EXPECT_EQ(r[0].tokens.size(), 3u);
  }
}

TEST(EnginePromptLogprobs, EverySampleGetsThem) {
  const Tiny tiny;
  auto runner = tiny.runner(8);
  const std::vector<int32_t> a = tiny.prompt(21, 5);
  const auto out = run(*runner, EngineOptions{}, {scored_request(a, 2, 3)});
  for (const SampleOut& s : out[0]) expect_reference(tiny, a, 2, s);
}

TEST(EnginePromptLogprobs, AScoredPromptIsNotTakenFromThePrefixCache) {
  const Tiny tiny;
  auto runner = tiny.runner(256);
  const std::vector<int32_t> a = tiny.prompt(26, 6);
  EngineRequest warm = scored_request(a, 0);
  warm.params.prompt_logprobs = -1;
  EngineRequest again = warm;
  // The first fills the cache; the second would hit it; the third is scored.
  const auto out = run(*runner, EngineOptions{}, {warm, again, scored_request(a, 1)}, true);
  EXPECT_GT(out[1][0].cached, 0);
  EXPECT_EQ(out[2][0].cached, 0);
  expect_reference(tiny, a, 1, out[2][0]);
}

TEST(EnginePromptLogprobs, OutOfRangeIsRefused) {
  const Tiny tiny;
  auto runner = tiny.runner(8);
  Engine engine(*runner, stories_tokenizer());
  EngineRequest r = scored_request(tiny.prompt(4, 7), 21);
  EXPECT_THROW(engine.submit(r), Error);
  r.params.prompt_logprobs = -2;
  EXPECT_THROW(engine.submit(r), Error);
}

}  // namespace
}  // namespace serval
