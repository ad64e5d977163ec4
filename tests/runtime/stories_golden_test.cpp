// The project's golden test: stories260K.gguf, loaded by load_model, prefilled
// with BOS + "Once upon a time" and decoded greedily (runner + argmax only),
// reproduces llama2.c's reference token ids exactly.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/model_loader.h"
#include "stories_golden.h"

namespace serval::testing {
namespace {

constexpr int kSteps = 200;

std::string stories_path() { return models_dir() + "/stories260K/stories260K.gguf"; }

void expect_golden(const std::vector<int32_t>& generated) {
  const std::vector<int32_t>& ref = stories_reference_ids();
  // The reference starts with the 4 prompt tokens after BOS.
  ASSERT_EQ(generated.size(), size_t(kSteps));
  for (size_t i = 0; i < generated.size(); ++i)
    ASSERT_EQ(generated[i], ref[4 + i]) << "generated token " << i << " differs from llama2.c's";
}

TEST(StoriesGolden, GreedyDecodeReproducesLlama2c) {
  if (!std::filesystem::exists(stories_path())) GTEST_FAIL() << stories_path() << " not found; set SERVAL_MODELS";
  LoadedModel model = load_model(stories_path());
  RunnerOptions opts;
  opts.kv_cache_tokens = 512;
  auto runner = ModelRunner::create(model.config, model.weights, opts);
  expect_golden(stories_greedy(*runner, kSteps, 1)[0]);
}

TEST(StoriesGolden, ThreeSequencesWithChunkedPrefillInOneBatch) {
  if (!std::filesystem::exists(stories_path())) GTEST_FAIL() << stories_path() << " not found; set SERVAL_MODELS";
  LoadedModel model = load_model(stories_path());
  RunnerOptions opts;
  opts.block_size = 8;
  opts.kv_cache_tokens = 3 * 256;
  auto runner = ModelRunner::create(model.config, model.weights, opts);
  for (const auto& generated : stories_greedy(*runner, kSteps, 3)) expect_golden(generated);
}

}  // namespace
}  // namespace serval::testing
