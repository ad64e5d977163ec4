#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace serval {
namespace {

std::vector<float> logits_of_probs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(p > 0 ? float(std::log(p)) : -INFINITY);
  return logits;
}

std::vector<int> histogram(const std::vector<float>& logits, const SamplingParams& params,
                           int draws, uint64_t seed) {
  Sampler sampler;
  Rng rng(seed);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits, params, {}, {}, rng).token];
  return counts;
}

// Pearson chi-square of observed counts against expected probabilities.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    const double expected = probs[i] * draws;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

std::vector<double> softmax(const std::vector<double>& x) {
  double max = -INFINITY, sum = 0.0;
  for (double v : x) max = std::max(max, v);
  std::vector<double> p;
  for (double v : x) p.push_back(std::exp(v - max)), sum += p.back();
  for (double& v : p) v /= sum;
  return p;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler sampler;
  Rng rng(1);
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(sampler.sample(logits, p, {}, {}, rng).token, 1);
  const std::vector<float> neg = {-5.0f, -INFINITY, -4.0f};
  EXPECT_EQ(sampler.sample(neg, p, {}, {}, rng).token, 2);
}

// logit_bias is added before penalties (vLLM's order) and sampling; the
// logprobs stay the raw ones; the distribution is the biased softmax.
TEST(Sampler, LogitBiasShiftsTheLogitsBeforePenalties) {
  Sampler sampler;
  Rng rng(1);
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 1;
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f};
  p.logit_bias = {{2, 3.5f}};  // -1 + 3.5 = 2.5 < 3: token 1 still wins
  EXPECT_EQ(sampler.sample(logits, p, {}, {}, rng).token, 1);
  p.logit_bias = {{2, 4.5f}, {1, -100.0f}};
  const SampleResult r = sampler.sample(logits, p, {}, {}, rng);
  EXPECT_EQ(r.token, 2);
  ASSERT_TRUE(r.logprobs);
  EXPECT_EQ(r.logprobs->top[0].token, 1);  // the raw distribution's
  // Before the repetition penalty: 3.0 - 1.0 = 2.0, then / 2 = 1.0 < 2.0 (token 3).
  p.logit_bias = {{1, -1.0f}};
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {1};
  EXPECT_EQ(sampler.sample(logits, p, prompt, {}, rng).token, 3);
  // Sampling draws from the biased softmax.
  SamplingParams t;
  t.logit_bias = {{0, std::log(3.0f)}};
  const std::vector<float> flat = logits_of_probs({0.25, 0.25, 0.25, 0.25});
  const int draws = 40000;
  const std::vector<int> counts = histogram(flat, t, draws, 7);
  EXPECT_LT(chi_square(counts, {0.5, 1.0 / 6, 1.0 / 6, 1.0 / 6}, draws), 16.27);  // p = 0.001, 3 dof
  // An id outside the vocabulary is refused.
  t.logit_bias = {{9, 1.0f}};
  EXPECT_THROW(sampler.sample(flat, t, {}, {}, rng), Error);
}

// A mask of allowed tokens (structured output): the others are never drawn,
// greedy or sampled; the logprobs stay raw; a mask allowing nothing with a
// finite logit is refused; a short mask is refused.
TEST(Sampler, OnlyAllowedTokensAreDrawn) {
  Sampler sampler;
  Rng rng(3);
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f, 1.0f};
  const std::vector<uint32_t> allowed = {(1u << 0) | (1u << 2) | (1u << 4)};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 0;
  const SampleResult g = sampler.sample(logits, greedy, {}, {}, rng, {}, allowed);
  EXPECT_EQ(g.token, 4);
  EXPECT_NEAR(g.logprobs->chosen, 1.0 - log_sum_exp(logits), 1e-5);
  SamplingParams t;
  for (int i = 0; i < 2000; ++i) {
    const int32_t tok = sampler.sample(logits, t, {}, {}, rng, {}, allowed).token;
    ASSERT_TRUE(tok == 0 || tok == 2 || tok == 4) << tok;
  }
  const std::vector<uint32_t> none = {0u};
  EXPECT_THROW(sampler.sample(logits, t, {}, {}, rng, {}, none), Error);
  const std::vector<float> wide(40, 0.0f);
  EXPECT_THROW(sampler.sample(wide, t, {}, {}, rng, {}, allowed), Error);
}

TEST(Sampler, GreedyAppliesPenalties) {
  Sampler sampler;
  Rng rng(1);
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const std::vector<int32_t> output = {1};
  p.repetition_penalty = 2.0f;  // token 1: 3 / 2 = 1.5 < 2
  EXPECT_EQ(sampler.sample(logits, p, {}, output, rng).token, 2);
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.5f;  // 2.5 > 2
  EXPECT_EQ(sampler.sample(logits, p, {}, output, rng).token, 1);
  p.frequency_penalty = 1.0f;  // 1.5 < 2
  EXPECT_EQ(sampler.sample(logits, p, {}, output, rng).token, 2);
  const std::vector<int32_t> prompt = {2, 1};  // repetition covers the prompt too
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.repetition_penalty = 4.0f;
  EXPECT_EQ(sampler.sample(logits, p, prompt, {}, rng).token, 0);
}

TEST(Sampler, FrequenciesMatchSoftmax) {
  const std::vector<double> x = {1.0, 0.5, 2.0, -1.0, 0.0, 1.5, -0.5, 0.25};
  std::vector<float> logits(x.begin(), x.end());
  const int draws = 40000;
  SamplingParams p;
  // 7 degrees of freedom: P(chi2 > 24.3) = 0.001. The seed is fixed, so this
  // is deterministic; a biased sampler would exceed it by orders of magnitude.
  EXPECT_LT(chi_square(histogram(logits, p, draws, 1234), softmax(x), draws), 24.3);

  p.temperature = 0.5f;
  std::vector<double> scaled;
  for (double v : x) scaled.push_back(v / 0.5);
  EXPECT_LT(chi_square(histogram(logits, p, draws, 99), softmax(scaled), draws), 24.3);
}

TEST(Sampler, ABiasedDistributionFailsTheChiSquareCheck) {
  // The check above can fail: the same counts against a slightly wrong
  // distribution are rejected.
  const std::vector<double> x = {1.0, 0.5, 2.0, -1.0, 0.0, 1.5, -0.5, 0.25};
  std::vector<float> logits(x.begin(), x.end());
  const int draws = 40000;
  std::vector<double> wrong = x;
  wrong[2] += 0.1;
  EXPECT_GT(chi_square(histogram(logits, SamplingParams{}, draws, 1234), softmax(wrong), draws),
            24.3);
}

TEST(Sampler, TopKKeepsKMostLikelyRenormalized) {
  const std::vector<double> probs = {0.1, 0.3, 0.05, 0.25, 0.2, 0.1};
  SamplingParams p;
  p.top_k = 3;  // keeps 1, 3, 4
  const int draws = 30000;
  const std::vector<double> expected = {0, 0.3 / 0.75, 0, 0.25 / 0.75, 0.2 / 0.75, 0};
  // 2 degrees of freedom: P(chi2 > 13.8) = 0.001.
  EXPECT_LT(chi_square(histogram(logits_of_probs(probs), p, draws, 5), expected, draws), 13.8);
}

TEST(Sampler, TopKKeepsAllTiesAtTheBoundary) {
  const std::vector<float> logits = {1.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.top_k = 2;  // the 2nd largest value (1.0) is shared by tokens 0 and 2
  const auto counts = histogram(logits, p, 3000, 5);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  const std::vector<double> probs = {0.05, 0.5, 0.15, 0.3};
  const auto logits = logits_of_probs(probs);
  SamplingParams p;
  const int draws = 20000;
  p.top_p = 0.75f;  // 0.5 + 0.3 = 0.8 >= 0.75 → {1, 3}
  EXPECT_LT(chi_square(histogram(logits, p, draws, 11), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, draws),
            10.8);  // 1 dof, p = 0.001
  p.top_p = 0.85f;  // needs 0.15 too → {1, 3, 2}
  EXPECT_LT(chi_square(histogram(logits, p, draws, 12),
                       {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95}, draws),
            13.8);
  p.top_p = 0.3f;  // the most likely token alone already has 0.5
  EXPECT_EQ(histogram(logits, p, 500, 13)[1], 500);
}

TEST(Sampler, TopPZeroKeepsTheMostLikelyTokenAlone) {
  // OpenAI allows top_p 0: the smallest nucleus, the lowest id first on ties.
  SamplingParams p;
  p.top_p = 0.0f;
  p.temperature = 2.0f;
  EXPECT_EQ(histogram(logits_of_probs({0.2, 0.2, 0.35, 0.25}), p, 500, 5)[2], 500);
  EXPECT_EQ(histogram(logits_of_probs({0.1, 0.45, 0.45}), p, 500, 6)[1], 500);
  p.min_p = 0.5f;
  p.top_k = 2;
  EXPECT_EQ(histogram(logits_of_probs({0.1, 0.45, 0.45}), p, 500, 7)[1], 500);
}

TEST(Sampler, TopPAppliesToTheTopKDistribution) {
  const std::vector<double> probs = {0.4, 0.3, 0.2, 0.1};
  SamplingParams p;
  p.top_k = 2;     // {0: 4/7, 1: 3/7}
  p.top_p = 0.5f;  // 4/7 > 0.5: token 0 only (without top-k it would need token 1 too)
  EXPECT_EQ(histogram(logits_of_probs(probs), p, 500, 3)[0], 500);
}

TEST(Sampler, MinPDropsTokensBelowFractionOfMax) {
  const std::vector<double> probs = {0.4, 0.3, 0.19, 0.11};
  SamplingParams p;
  p.min_p = 0.3f;  // threshold 0.12: drops token 3
  const int draws = 20000;
  EXPECT_LT(chi_square(histogram(logits_of_probs(probs), p, draws, 17),
                       {0.4 / 0.89, 0.3 / 0.89, 0.19 / 0.89, 0}, draws),
            13.8);
  p.min_p = 1.0f;
  EXPECT_EQ(histogram(logits_of_probs(probs), p, 300, 17)[0], 300);
}

TEST(Sampler, TopPOnLargeVocabularyKeepsTheExactSet) {
  // 300 "likely" tokens (equal logits) spread over a 50k vocabulary, the rest
  // flat: top_p needs about 190 of the likely ones, the lowest ids first.
  const int vocab = 50000;
  std::vector<float> logits(vocab, 0.0f);
  std::vector<int32_t> likely;
  for (int i = 0; i < 300; ++i) likely.push_back((i * 7919 + 13) % vocab);
  for (int32_t id : likely) logits[id] = 5.0f;
  const double e5 = std::exp(5.0), total = 300 * e5 + (vocab - 300);
  SamplingParams p;
  p.top_p = 0.3f;
  // Keep j (0-based, lower id first among ties) while j * e^5 < 0.3 * total.
  const int kept = int(std::ceil(0.3 * total / e5));
  ASSERT_GT(kept, 64);
  ASSERT_LT(kept, 300);
  std::set<int32_t> sorted_likely(likely.begin(), likely.end());
  std::set<int32_t> allowed;
  for (int32_t id : sorted_likely) {
    if (int(allowed.size()) == kept) break;
    allowed.insert(id);
  }
  Sampler sampler;
  Rng rng(77);
  std::set<int32_t> drawn;
  for (int i = 0; i < 1500; ++i) {
    const int32_t t = sampler.sample(logits, p, {}, {}, rng).token;
    ASSERT_TRUE(allowed.count(t)) << "token " << t << " is outside the top-p set";
    drawn.insert(t);
  }
  EXPECT_GT(int(drawn.size()), kept - 10);  // 1500 draws over ~190 equal tokens
}

TEST(Sampler, TopKOnWideRangeMatchesSortedReference) {
  // Logits spread over 80 logits, so the cut can fall in any bucket, including
  // the tail below max - 32. The reference is a plain full sort.
  const int vocab = 5000;
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[i] = float(((i * 2654435761u) % 8000) / 100.0) - 40.0f;
  logits[17] = -INFINITY;
  for (int k : {1, 7, 50, 300, 1000, 4000}) {
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float threshold = sorted[k - 1];
    SamplingParams p;
    p.top_k = k;
    p.temperature = 50.0f;  // flatten, so the low tokens are drawn too
    Sampler sampler;
    Rng rng{uint64_t(k)};
    float lowest_drawn = INFINITY;
    for (int i = 0; i < 2000; ++i) {
      const int32_t t = sampler.sample(logits, p, {}, {}, rng).token;
      ASSERT_GE(logits[t], threshold) << "k=" << k;
      lowest_drawn = std::min(lowest_drawn, logits[t]);
    }
    if (k >= 1000) {
      EXPECT_LT(lowest_drawn, sorted[k / 2]) << "k=" << k;
    }
  }
}

TEST(Sampler, SeededSamplingIsReproducibleAndSeedsDiffer) {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = float(std::sin(i * 0.37) * 3.0);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 200;
  p.top_p = 0.95f;
  auto run = [&](uint64_t seed) {
    Sampler sampler;
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(sampler.sample(logits, p, {}, out, rng).token);
    return out;
  };
  EXPECT_EQ(run(2024), run(2024));
  EXPECT_NE(run(2024), run(2025));
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, -3.0f};
  SamplingParams p;
  p.temperature = 0.3f;           // logprobs do not depend on these
  p.repetition_penalty = 1.7f;
  p.top_k = 2;
  p.logprobs = 3;
  Sampler sampler;
  Rng rng(3);
  const std::vector<int32_t> prompt = {1};
  const SampleResult r = sampler.sample(logits, p, prompt, {}, rng);
  ASSERT_TRUE(r.logprobs.has_value());
  long double z = 0;
  for (float x : logits) z += std::exp((long double)x);
  auto ref = [&](int id) { return double(logits[id] - std::log(z)); };
  EXPECT_NEAR(r.logprobs->chosen, ref(r.token), 1e-6);
  ASSERT_EQ(r.logprobs->top.size(), 3u);
  EXPECT_EQ(r.logprobs->top[0].token, 1);  // tie with 4: lower id first
  EXPECT_EQ(r.logprobs->top[1].token, 4);
  EXPECT_EQ(r.logprobs->top[2].token, 3);
  for (const auto& t : r.logprobs->top) EXPECT_NEAR(t.logprob, ref(t.token), 1e-6);

  p.logprobs = -1;
  EXPECT_FALSE(sampler.sample(logits, p, prompt, {}, rng).logprobs.has_value());
  p.logprobs = 0;
  const auto r0 = sampler.sample(logits, p, prompt, {}, rng);
  ASSERT_TRUE(r0.logprobs.has_value());
  EXPECT_TRUE(r0.logprobs->top.empty());
}

TEST(Logprobs, SumToOneAndAreOrdered) {
  std::vector<float> logits(64);
  for (int i = 0; i < 64; ++i) logits[i] = float(std::cos(i * 1.3) * 4.0);
  const Logprobs lp = compute_logprobs(logits, 5, 64);
  ASSERT_EQ(lp.top.size(), 64u);
  double sum = 0;
  std::set<int32_t> ids;
  for (size_t i = 0; i < lp.top.size(); ++i) {
    sum += std::exp(double(lp.top[i].logprob));
    ids.insert(lp.top[i].token);
    if (i > 0) {
      EXPECT_GE(lp.top[i - 1].logprob, lp.top[i].logprob);
    }
    if (lp.top[i].token == 5) {  // the chosen token
      EXPECT_EQ(lp.top[i].logprob, lp.chosen);
      EXPECT_EQ(lp.chosen_rank, int32_t(i) + 1);
    }
  }
  EXPECT_EQ(ids.size(), 64u);
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

TEST(Sampler, BrokenLogitsThrow) {
  Sampler sampler;
  Rng rng(1);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<float> nan = {0.0f, NAN, 1.0f};
  const std::vector<float> inf = {0.0f, INFINITY};
  const std::vector<float> none = {-INFINITY, -INFINITY};
  for (const SamplingParams& p : {greedy, SamplingParams{}}) {
    EXPECT_THROW(sampler.sample(nan, p, {}, {}, rng), Error);
    EXPECT_THROW(sampler.sample(inf, p, {}, {}, rng), Error);
    EXPECT_THROW(sampler.sample(none, p, {}, {}, rng), Error);
    EXPECT_THROW(sampler.sample({}, p, {}, {}, rng), Error);
  }
}

TEST(Sampler, LargeVocabularyIsFast) {
  // Not a benchmark: guards against accidental full sorts or per-call
  // allocations proportional to vocab * something. 128k vocab, 200 draws with
  // each filter must stay well under a second even in a debug build.
  const int vocab = 128256;
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[i] = float(std::sin(i * 0.001) * 8.0 + (i % 97) * 0.01);
  Sampler sampler;
  Rng rng(9);
  SamplingParams p;
  p.top_p = 0.9f;
  p.top_k = 50;
  p.min_p = 0.05f;
  p.logprobs = 5;
  std::vector<int32_t> out;
  for (int i = 0; i < 200; ++i) out.push_back(sampler.sample(logits, p, {}, out, rng).token);
  EXPECT_EQ(out.size(), 200u);
}

}  // namespace
}  // namespace serval

namespace serval {
namespace {

// min_tokens: banned tokens (EOS, stop tokens) are never chosen, greedy or
// sampled; logprobs stay those of the raw logits.
TEST(Sampler, BannedTokensAreNeverChosen) {
  const std::vector<float> logits = {0.5f, 3.0f, 2.0f, 1.0f};
  const std::vector<int32_t> banned = {1, 7 /* outside the vocabulary: ignored */};
  Sampler sampler;
  Rng rng(3);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 1;
  const SampleResult g = sampler.sample(logits, greedy, {}, {}, rng, banned);
  EXPECT_EQ(g.token, 2);
  ASSERT_TRUE(g.logprobs.has_value());
  EXPECT_EQ(g.logprobs->top[0].token, 1);  // the raw distribution's best
  EXPECT_EQ(sampler.sample(logits, greedy, {}, {}, rng).token, 1);  // without the ban
  SamplingParams sampled;
  sampled.temperature = 2.0f;
  for (int i = 0; i < 2000; ++i) EXPECT_NE(sampler.sample(logits, sampled, {}, {}, rng, banned).token, 1);
}

}  // namespace
}  // namespace serval
