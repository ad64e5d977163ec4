// The Engine over real CPU ModelRunners (ported from the former Generator
// tests): on a tiny random model, greedy output matches argmax of the
// double-precision reference forward pass and batching is invariant; on
// stories260K, three greedy copies batched with a sampled request (and a
// greedy n = 2 request) give llama2.c's 252 reference tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "../runtime/stories_golden.h"
#include "../runtime/tiny_model.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/model_loader.h"

namespace serval {
namespace {

const Tokenizer& stories_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const std::string path = models_dir() + "/stories260K/stories260K.gguf";
    if (!std::filesystem::exists(path)) throw Error(path + " not found (set SERVAL_MODELS)");
    return load_tokenizer(path);
  }();
  return *tok;
}

// Tokens of every sample of each request, all submitted at once.
std::vector<std::vector<std::vector<int32_t>>> run(ModelRunner& runner, const Tokenizer& tok,
                                                   const std::vector<EngineRequest>& requests) {
  Engine engine(runner, tok);
  std::vector<RequestHandle> handles;
  for (const EngineRequest& r : requests) handles.push_back(engine.submit(r));
  std::vector<std::vector<std::vector<int32_t>>> out;
  for (size_t i = 0; i < handles.size(); ++i) {
    std::vector<std::vector<int32_t>> samples(size_t(requests[i].n));
    for (int finals = 0; finals < requests[i].n;) {
      std::optional<RequestEvent> ev = handles[i].next(std::chrono::milliseconds(60000));
      if (!ev) throw Error("no event within 60 s");
      auto& s = samples.at(size_t(ev->index));
      s.insert(s.end(), ev->token_ids.begin(), ev->token_ids.end());
      if (ev->finished()) {
        EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
        ++finals;
      }
    }
    out.push_back(std::move(samples));
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  return out;
}

struct TinyModel {
  testing::TinySpec spec;
  ModelConfig cfg;
  WeightStore weights;
  TinyModel() {
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

EngineRequest request(std::vector<int32_t> prompt, int32_t max_tokens, float temperature,
                      int32_t n = 1) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = temperature;
  r.params.seed = 17;
  r.stop.max_tokens = max_tokens;
  r.n = n;
  return r;
}

TEST(EngineRuntime, TinyGreedyMatchesReferenceAndBatchingIsInvariant) {
  const TinyModel tiny;
  const std::vector<EngineRequest> requests = {request(tiny.prompt(7, 1), 10, 0.0f),
                                               request(tiny.prompt(13, 2), 6, 0.0f, 2),
                                               request(tiny.prompt(2, 3), 12, 0.8f)};
  auto runner = tiny.runner(256);
  const auto batched = run(*runner, stories_tokenizer(), requests);
  EXPECT_EQ(batched[0][0], tiny.reference_greedy(requests[0].prompt_ids, 10));
  EXPECT_EQ(batched[1][0], tiny.reference_greedy(requests[1].prompt_ids, 6));
  EXPECT_EQ(batched[1][1], batched[1][0]);  // greedy samples are equal
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone_runner = tiny.runner(64);
    EXPECT_EQ(batched[i][0], run(*alone_runner, stories_tokenizer(), {requests[i]})[0][0])
        << "request " << i;
  }
}

TEST(EngineRuntime, StoriesGreedyMatchesLlama2cInABatch) {
  const std::string path = models_dir() + "/stories260K/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_FAIL() << path << " not found (set SERVAL_MODELS)";
  const LoadedModel model = load_model(path);
  RunnerOptions opts;
  opts.threads = 2;
  auto runner = ModelRunner::create(model.config, model.weights, opts);
  const std::vector<int32_t>& ref = testing::stories_reference_ids();
  const int n = int(ref.size()) - 4;
  EngineRequest greedy = request(testing::stories_prompt(), n, 0.0f);
  EngineRequest sampled = request(testing::stories_prompt(), n, 1.0f);
  sampled.params.seed = 3;
  EngineRequest pair = greedy;
  pair.n = 2;
  const auto out = run(*runner, stories_tokenizer(), {greedy, sampled, greedy, greedy, pair});
  const std::vector<int32_t> expected(ref.begin() + 4, ref.end());
  for (size_t i : {0, 2, 3}) EXPECT_EQ(out[i][0], expected) << "request " << i;
  EXPECT_EQ(out[4][0], expected);
  EXPECT_EQ(out[4][1], expected);
  EXPECT_NE(out[1][0], expected);
}

}  // namespace
}  // namespace serval
