// eval/perplexity against the plain double-precision reference forward pass
// (tests/runtime/tiny_model): llama.cpp's chunks, BOS first, the second half
// scored; token_nll on hand-computed values; a text short of one chunk refused.
#include "eval/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "../runtime/tiny_model.h"

namespace serval::testing {
namespace {

TEST(Perplexity, TokenNllIsTheNegativeLogSoftmax) {
  const std::vector<float> even = {0.0f, 0.0f}, three = {1.0f, 2.0f, 3.0f};
  EXPECT_NEAR(token_nll(even, 0), std::log(2.0), 1e-12);
  EXPECT_NEAR(token_nll(three, 2), std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0), 1e-12);
  EXPECT_NEAR(token_nll(three, 0), 2.0 + std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0), 1e-12);
  EXPECT_THROW(token_nll(three, 3), Error);
}

TEST(Perplexity, MatchesTheReferenceForwardPass) {
  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  RunnerOptions opts;
  opts.device = "cpu";
  opts.threads = 1;
  opts.kv_cache_tokens = 32;
  auto runner = ModelRunner::create(cfg, w, opts);

  const int64_t ctx = 16, chunks = 3;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(2, int32_t(cfg.vocab_size) - 1);
  std::vector<int32_t> tokens(size_t(ctx * chunks + 7));  // and a partial chunk, never scored
  for (int32_t& t : tokens) t = tok(rng);
  PerplexityOptions o;
  o.ctx = ctx;
  o.bos_id = 1;
  int calls = 0, rows = 0;
  PerplexityObserver watch;
  watch.on_chunk = [&](const PerplexityResult&) { ++calls; };
  watch.on_row = [&](std::span<const float> logits, int32_t) { rows += logits.size() == size_t(cfg.vocab_size); };
  const PerplexityResult r = perplexity(*runner, tokens, o, watch);

  double nll = 0;
  int64_t scored = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    chunk[0] = 1;
    const auto logits = reference_logits(cfg, w, chunk);
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      const std::vector<double>& row = logits[size_t(j)];
      double sum = 0;
      for (double v : row) sum += std::exp(v);
      nll += std::log(sum) - row[size_t(tokens[size_t(c * ctx + j + 1)])];
      ++scored;
    }
  }
  EXPECT_EQ(r.chunks, chunks);
  EXPECT_EQ(calls, chunks);
  EXPECT_EQ(rows, scored);
  EXPECT_EQ(r.scored, scored);
  EXPECT_NEAR(r.mean_nll(), nll / double(scored), 1e-5);
  EXPECT_NEAR(r.perplexity(), std::exp(nll / double(scored)), 1e-4 * std::exp(nll / double(scored)));
  ASSERT_EQ(r.running.size(), size_t(chunks));
  EXPECT_DOUBLE_EQ(r.running.back(), r.perplexity());

  o.max_chunks = 2;
  EXPECT_EQ(perplexity(*runner, tokens, o).chunks, 2);
  try {
    (void)perplexity(*runner, std::vector<int32_t>(tokens.begin(), tokens.begin() + 15), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one chunk of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace serval::testing
