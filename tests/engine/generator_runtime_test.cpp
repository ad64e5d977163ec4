// The Generator over the real CPU ModelRunner on a tiny random model: greedy
// output matches argmax of the double-precision reference forward pass, and
// sequences batched together give what each gives alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/generator.h"
#include "../runtime/tiny_model.h"

namespace serval {
namespace {

struct TinyRunner {
  testing::TinySpec spec;
  ModelConfig cfg;
  WeightStore weights;
  TinyRunner() {
    spec.arch = "llama";
    spec.seed = 5;
    cfg = testing::tiny_config(spec);
    weights = testing::tiny_weights(cfg, spec);
  }
  std::unique_ptr<ModelRunner> runner(int64_t tokens) const {
    RunnerOptions o;
    o.block_size = 4;
    o.kv_cache_tokens = tokens;
    o.threads = 2;
    return ModelRunner::create(cfg, weights, o);
  }
  std::vector<int32_t> prompt(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(cfg.vocab_size));
    return t;
  }
  std::vector<int32_t> reference_greedy(std::vector<int32_t> tokens, int n) const {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      const auto logits = testing::reference_logits(cfg, weights, tokens).back();
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      tokens.push_back(next);
    }
    return out;
  }
};

GenerationRequest request(std::vector<int32_t> prompt, int32_t max_tokens, float temperature) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = temperature;
  r.params.seed = 17;
  r.stop.max_tokens = max_tokens;
  return r;
}

TEST(GeneratorRuntime, GreedyMatchesReferenceAndBatchingIsInvariant) {
  const TinyRunner tiny;
  const std::vector<GenerationRequest> requests = {
      request(tiny.prompt(7, 1), 10, 0.0f), request(tiny.prompt(13, 2), 6, 0.0f),
      request(tiny.prompt(2, 3), 12, 0.8f)};
  auto runner = tiny.runner(256);
  Generator gen(*runner);
  const GenerationResult batched = gen.generate(requests);
  EXPECT_EQ(batched.sequences[0].token_ids, tiny.reference_greedy(requests[0].prompt_ids, 10));
  EXPECT_EQ(batched.sequences[1].token_ids, tiny.reference_greedy(requests[1].prompt_ids, 6));
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone_runner = tiny.runner(64);
    const GenerationResult alone = Generator(*alone_runner).generate({requests[i]});
    EXPECT_EQ(batched.sequences[i].token_ids, alone.sequences[0].token_ids) << "sequence " << i;
  }
  EXPECT_EQ(gen.kv().usage().used_blocks, 0);
}

}  // namespace
}  // namespace serval
