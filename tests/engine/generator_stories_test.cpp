// The golden generation through the whole engine path: stories260K loaded from
// GGUF, CPU ModelRunner, Generator (paged KV, BatchBuilder, Sampler), greedy.
// Reference: llama2.c's greedy ids (../shared/models/PROVENANCE.md).
#include <gtest/gtest.h>

#include <filesystem>

#include "../runtime/stories_golden.h"
#include "engine/generator.h"
#include "model/model_loader.h"

namespace serval {
namespace {

TEST(GeneratorStories, GreedyMatchesLlama2c) {
  const std::string path = models_dir() + "/stories260K/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_FAIL() << path << " not found (set SERVAL_MODELS)";
  const LoadedModel model = load_model(path);
  RunnerOptions opts;
  opts.threads = 2;
  auto runner = ModelRunner::create(model.config, model.weights, opts);
  const std::vector<int32_t>& ref = testing::stories_reference_ids();
  const std::vector<int32_t>& prompt = testing::stories_prompt();  // BOS + 4 tokens
  const int n = int(ref.size()) - 4;
  GenerationRequest greedy;
  greedy.prompt_ids = prompt;
  greedy.params.temperature = 0.0f;
  greedy.stop.max_tokens = n;
  // Three copies in one batch, plus a sampled sequence mixed in: batching must
  // not change the greedy ones.
  GenerationRequest sampled = greedy;
  sampled.params.temperature = 1.0f;
  sampled.params.seed = 3;
  Generator gen(*runner);
  const GenerationResult r = gen.generate({greedy, sampled, greedy, greedy});
  const std::vector<int32_t> expected(ref.begin() + 4, ref.end());
  for (size_t i : {0, 2, 3}) EXPECT_EQ(r.sequences[i].token_ids, expected) << "sequence " << i;
  EXPECT_NE(r.sequences[1].token_ids, expected);
  EXPECT_EQ(gen.kv().usage().used_blocks, 0);
}

}  // namespace
}  // namespace serval
