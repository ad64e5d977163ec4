#include "engine/generator.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "core/error.h"
#include "fake_model_runner.h"

namespace serval {
namespace {

using testing::FakeModelRunner;
using testing::toy_greedy;

constexpr int64_t kVocab = 97;

GenerationRequest greedy_request(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  return r;
}

GenerationRequest sampled_request(std::vector<int32_t> prompt, int32_t max_tokens, uint64_t seed) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0.9f;
  r.params.top_k = 20;
  r.params.top_p = 0.9f;
  r.params.seed = seed;
  r.stop.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> iota_prompt(int n, int32_t first) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = (first + 7 * i) % int32_t(kVocab);
  return p;
}

TEST(Generator, GreedyMatchesTheModelDirectly) {
  FakeModelRunner runner(kVocab, 4, 64);
  Generator gen(runner);
  const auto prompt = iota_prompt(10, 3);
  const GenerationResult r = gen.generate({greedy_request(prompt, 12)});
  ASSERT_EQ(r.sequences.size(), 1u);
  EXPECT_EQ(r.sequences[0].token_ids, toy_greedy(prompt, kVocab, 12));
  EXPECT_EQ(r.sequences[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.sequences[0].prompt_ids, prompt);
  // Whole prompt in the first forward, then one token per step; the last
  // sampled token is never fed back.
  ASSERT_EQ(runner.batches.size(), 12u);
  EXPECT_EQ(runner.batches[0].num_tokens(), 10);
  EXPECT_EQ(runner.batches[0].logits_rows, (std::vector<int32_t>{9}));
  for (size_t i = 1; i < runner.batches.size(); ++i) EXPECT_EQ(runner.batches[i].num_tokens(), 1);
  EXPECT_EQ(gen.kv().usage().used_blocks, 0);
}

TEST(Generator, BatchedSequencesMatchEachAlone) {
  std::vector<GenerationRequest> requests = {
      greedy_request(iota_prompt(5, 1), 9),     sampled_request(iota_prompt(17, 2), 14, 7),
      greedy_request(iota_prompt(1, 40), 20),   sampled_request(iota_prompt(8, 9), 3, 1234),
      sampled_request(iota_prompt(8, 9), 11, 99),
  };
  std::vector<std::vector<int32_t>> alone;
  for (const auto& req : requests) {
    FakeModelRunner runner(kVocab, 4, 64);
    Generator gen(runner);
    alone.push_back(gen.generate({req}).sequences[0].token_ids);
  }
  FakeModelRunner runner(kVocab, 4, 64);
  Generator gen(runner);
  const GenerationResult r = gen.generate(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(r.sequences[i].token_ids, alone[i]) << "sequence " << i;
    EXPECT_EQ(int(r.sequences[i].token_ids.size()), requests[i].stop.max_tokens);
  }
  EXPECT_EQ(alone[0], toy_greedy(requests[0].prompt_ids, kVocab, 9));
  // All prompts in one ragged first batch, each with its logits row.
  const Batch& first = runner.batches[0];
  EXPECT_EQ(first.num_tokens(), 5 + 17 + 1 + 8 + 8);
  EXPECT_EQ(first.num_seqs(), 5);
  EXPECT_EQ(first.logits_rows, (std::vector<int32_t>{4, 21, 22, 30, 38}));
  EXPECT_EQ(runner.batches[1].num_tokens(), 5);
  EXPECT_EQ(gen.kv().usage().used_blocks, 0);
  EXPECT_EQ(r.stats.prompt_tokens, 39);
  EXPECT_EQ(r.stats.generated_tokens, 9 + 14 + 20 + 3 + 11);
  EXPECT_EQ(r.stats.steps, 20);
  EXPECT_EQ(r.stats.decode_tokens, r.stats.generated_tokens - 5);
}

TEST(Generator, SmallCacheRunsSequencesInTurnWithSameResults) {
  std::vector<GenerationRequest> requests = {
      greedy_request(iota_prompt(6, 1), 10), sampled_request(iota_prompt(9, 5), 7, 3),
      greedy_request(iota_prompt(3, 8), 12)};
  FakeModelRunner big(kVocab, 4, 64);
  const GenerationResult expected = Generator(big).generate(requests);
  // 4 blocks of 4 tokens: each sequence alone needs 4 (15, 15, 14 tokens).
  FakeModelRunner small(kVocab, 4, 4);
  Generator gen(small);
  const GenerationResult r = gen.generate(requests);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(r.sequences[i].token_ids, expected.sequences[i].token_ids) << "sequence " << i;
  for (const Batch& b : small.batches) EXPECT_EQ(b.num_seqs(), 1);
  EXPECT_EQ(gen.kv().usage().used_blocks, 0);
}

TEST(Generator, StopsAtEosUnlessIgnoredAndAtStopTokens) {
  const auto prompt = iota_prompt(7, 11);
  const auto greedy = toy_greedy(prompt, kVocab, 30);
  // The first token that does not occur earlier in the output works as EOS at that step.
  size_t k = 2;
  while (std::find(greedy.begin(), greedy.begin() + k, greedy[k]) != greedy.begin() + k) ++k;
  ASSERT_LT(k, greedy.size());
  FakeModelRunner runner(kVocab, 4, 64);
  Generator gen(runner);

  GenerationRequest eos = greedy_request(prompt, 30);
  eos.stop.eos_token_ids = {greedy[k]};
  GenerationRequest ignored = eos;
  ignored.stop.ignore_eos = true;
  GenerationRequest stop_token = greedy_request(prompt, 30);
  stop_token.stop.stop_token_ids = {greedy[k]};
  stop_token.stop.ignore_eos = true;  // stop tokens still stop

  const GenerationResult r = gen.generate({eos, ignored, stop_token});
  const std::vector<int32_t> until_eos(greedy.begin(), greedy.begin() + k + 1);
  EXPECT_EQ(r.sequences[0].token_ids, until_eos);  // EOS is part of the output
  EXPECT_EQ(r.sequences[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.sequences[0].stop_token, greedy[k]);
  EXPECT_EQ(r.sequences[1].token_ids, greedy);
  EXPECT_EQ(r.sequences[1].finish_reason, FinishReason::kLength);
  EXPECT_FALSE(r.sequences[1].stop_token.has_value());
  EXPECT_EQ(r.sequences[2].token_ids, until_eos);
  EXPECT_EQ(r.sequences[2].finish_reason, FinishReason::kStop);
  EXPECT_EQ(gen.kv().usage().used_blocks, 0);
}

TEST(Generator, StopsWhenTheContextIsFull) {
  FakeModelRunner runner(kVocab, 4, 64, /*max_position=*/16);
  Generator gen(runner);
  const GenerationResult r = gen.generate({greedy_request(iota_prompt(11, 0), 100)});
  EXPECT_EQ(r.sequences[0].token_ids.size(), 5u);
  EXPECT_EQ(r.sequences[0].finish_reason, FinishReason::kLength);
  for (const Batch& b : runner.batches)
    for (int32_t p : b.positions) EXPECT_LT(p, 16);
}

TEST(Generator, CallbackStreamsEveryTokenWithFinishOnTheLast) {
  FakeModelRunner runner(kVocab, 4, 64);
  Generator gen(runner);
  GenerationRequest a = sampled_request(iota_prompt(4, 1), 6, 5);
  a.params.logprobs = 2;
  GenerationRequest b = greedy_request(iota_prompt(9, 2), 3);
  std::map<int32_t, std::vector<TokenEvent>> events;
  std::map<int32_t, std::vector<Logprobs>> logprobs;
  const GenerationResult r = gen.generate({a, b}, [&](const TokenEvent& e) {
    events[e.seq_index].push_back(e);
    if (e.logprobs) logprobs[e.seq_index].push_back(*e.logprobs);
  });
  for (int32_t s : {0, 1}) {
    const auto& ev = events[s];
    ASSERT_EQ(ev.size(), r.sequences[size_t(s)].token_ids.size());
    for (size_t i = 0; i < ev.size(); ++i) {
      EXPECT_EQ(ev[i].token, r.sequences[size_t(s)].token_ids[i]);
      EXPECT_EQ(ev[i].finish, i + 1 == ev.size() ? FinishReason::kLength : FinishReason::kNone);
    }
  }
  ASSERT_EQ(logprobs[0].size(), 6u);
  EXPECT_TRUE(logprobs[1].empty());
  ASSERT_EQ(r.sequences[0].logprobs.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(logprobs[0][i].chosen, r.sequences[0].logprobs[i].chosen);
    EXPECT_EQ(r.sequences[0].logprobs[i].top.size(), 2u);
  }
}

TEST(Generator, UnseededRequestsReportTheirSeedWhichReproducesThem) {
  GenerationRequest req = sampled_request(iota_prompt(5, 3), 12, 0);
  req.params.seed.reset();
  FakeModelRunner runner(kVocab, 4, 64);
  Generator gen(runner);
  const GenerationResult first = gen.generate({req, req});
  EXPECT_NE(first.sequences[0].seed, first.sequences[1].seed);
  req.params.seed = first.sequences[1].seed;
  EXPECT_EQ(gen.generate({req}).sequences[0].token_ids, first.sequences[1].token_ids);
}

TEST(Generator, TimingsAreReported) {
  FakeModelRunner runner(kVocab, 4, 64);
  Generator gen(runner);
  const GenerationResult r = gen.generate({greedy_request(iota_prompt(5, 3), 8)});
  EXPECT_GT(r.stats.time_to_first_token_s, 0.0);
  EXPECT_EQ(r.stats.time_to_first_token_s, r.sequences[0].time_to_first_token_s);
  EXPECT_GT(r.stats.prefill_s, 0.0);
  EXPECT_GT(r.stats.decode_s, 0.0);
  EXPECT_EQ(r.stats.decode_tokens, 7);
  EXPECT_GT(r.stats.decode_tokens_per_s(), 0.0);
  EXPECT_GE(r.stats.total_s, r.stats.prefill_s + r.stats.decode_s);
}

TEST(Generator, RejectsBadRequestsBeforeRunningAnything) {
  FakeModelRunner runner(kVocab, 4, 8, /*max_position=*/40);
  Generator gen(runner);
  auto message = [&](const GenerationRequest& bad) {
    try {
      gen.generate({greedy_request(iota_prompt(3, 0), 2), bad});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(message(greedy_request({}, 2)), "request 1: the prompt is empty (no tokens)");
  EXPECT_EQ(message(greedy_request({1, 97}, 2)),
            "request 1: prompt token id 97 is outside the vocabulary [0, 97)");
  EXPECT_EQ(message(greedy_request(iota_prompt(40, 0), 2)),
            "request 1: the prompt has 40 tokens but the model's context is 40 tokens (the "
            "prompt must leave room for one generated token)");
  EXPECT_EQ(message(greedy_request(iota_prompt(30, 0), 5)),
            "request 1: 30 prompt tokens + max_tokens 5 need 9 KV blocks of 4 tokens but the "
            "cache has 8; lower max_tokens or give the KV cache more memory");
  GenerationRequest bad_params = greedy_request({1}, 2);
  bad_params.params.top_p = 2.0f;
  EXPECT_EQ(message(bad_params), "top_p must be in (0, 1], got 2");
  EXPECT_EQ(message(greedy_request({1}, 0)), "max_tokens must be at least 1, got 0");
  EXPECT_TRUE(runner.batches.empty());
}

}  // namespace
}  // namespace serval
