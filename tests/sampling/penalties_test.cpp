#include "sampling/penalties.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"

namespace serval {
namespace {

TEST(Penalties, RepetitionDividesPositiveMultipliesNegativeOverPromptAndOutput) {
  std::vector<float> logits = {2.0f, -2.0f, 3.0f, -1.0f, 4.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0, 1, 1};
  const std::vector<int32_t> output = {3};
  PenaltyApplier().apply(logits, p, prompt, output);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 3.0f, -2.0f, 4.0f}));
}

TEST(Penalties, FrequencyAndPresenceCountOutputTokensOnly) {
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<int32_t> prompt = {0, 0, 0};  // prompt does not count
  const std::vector<int32_t> output = {1, 2, 2, 2};
  PenaltyApplier().apply(logits, p, prompt, output);
  // OpenAI: logit - count * frequency - (count > 0) * presence
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 1.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[3], 1.0f);
}

TEST(Penalties, RepetitionAppliesBeforeFrequencyAndPresence) {
  std::vector<float> logits = {3.0f};
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 1.0f;
  p.presence_penalty = 1.0f;
  const std::vector<int32_t> output = {0, 0};
  PenaltyApplier().apply(logits, p, {}, output);
  EXPECT_FLOAT_EQ(logits[0], 3.0f / 1.5f - 2.0f - 1.0f);
}

TEST(Penalties, ScratchIsCleanBetweenCallsAndBadIdsThrow) {
  PenaltyApplier applier;
  SamplingParams p;
  p.frequency_penalty = 1.0f;
  std::vector<float> a = {0.0f, 0.0f, 0.0f};
  const std::vector<int32_t> out1 = {1, 1};
  applier.apply(a, p, {}, out1);
  EXPECT_EQ(a, (std::vector<float>{0.0f, -2.0f, 0.0f}));
  const std::vector<int32_t> bad = {2, 3};
  std::vector<float> b = {0.0f, 0.0f, 0.0f};
  EXPECT_THROW(applier.apply(b, p, {}, bad), Error);
  const std::vector<int32_t> out2 = {2};
  std::vector<float> c = {0.0f, 0.0f, 0.0f};
  applier.apply(c, p, {}, out2);
  EXPECT_EQ(c, (std::vector<float>{0.0f, 0.0f, -1.0f}));
}

}  // namespace
}  // namespace serval
