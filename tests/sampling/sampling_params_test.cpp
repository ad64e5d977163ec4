#include "sampling/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/error.h"

namespace serval {
namespace {

std::string error_of(const std::function<void(SamplingParams&)>& change) {
  SamplingParams p;
  change(p);
  try {
    p.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SamplingParams, DefaultsAndBoundsAreValid) {
  EXPECT_EQ(error_of([](SamplingParams&) {}), "");
  EXPECT_EQ(error_of([](SamplingParams& p) {
              p.temperature = 0.0f;
              p.top_p = 1.0f;
              p.top_k = -1;
              p.min_p = 1.0f;
              p.repetition_penalty = 10.0f;
              p.presence_penalty = -2.0f;
              p.frequency_penalty = 2.0f;
              p.logprobs = 20;
            }),
            "");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.temperature = 100.0f; p.top_k = 1; p.logprobs = 0; }), "");
}

TEST(SamplingParams, MessagesNameParameterRangeAndValue) {
  EXPECT_EQ(error_of([](SamplingParams& p) { p.temperature = -0.5f; }),
            "temperature must be in [0, 100], got -0.5");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.temperature = NAN; }),
            "temperature must be in [0, 100], got nan");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.temperature = 101.0f; }),
            "temperature must be in [0, 100], got 101");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.top_p = -0.1f; }), "top_p must be in [0, 1], got -0.1");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.top_p = 1.5f; }), "top_p must be in [0, 1], got 1.5");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.top_k = -2; }),
            "top_k must be -1 or 0 (disabled) or at least 1, got -2");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.min_p = -0.1f; }), "min_p must be in [0, 1], got -0.1");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.repetition_penalty = 0.0f; }),
            "repetition_penalty must be in (0, 10], got 0");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.presence_penalty = 2.5f; }),
            "presence_penalty must be in [-2, 2], got 2.5");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.frequency_penalty = -3.0f; }),
            "frequency_penalty must be in [-2, 2], got -3");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logprobs = 21; }),
            "logprobs must be in [0, 20] (or -1 for none), got 21");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logprobs = -2; }),
            "logprobs must be in [0, 20] (or -1 for none), got -2");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.prompt_logprobs = 21; }),
            "prompt_logprobs must be in [0, 20] (or -1 for none), got 21");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }),
            "logit_bias: the bias of token 3 must be in [-100, 100], got 100.5");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }),
            "logit_bias: the bias of token 3 must be in [-100, 100], got nan");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }), "logit_bias: token id -1 is negative");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logit_bias = {{4, 1.0f}, {4, 2.0f}}; }),
            "logit_bias: token id 4 is given twice");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logit_bias = {{4, -100.0f}, {5, 100.0f}}; }), "");
}

TEST(SamplingParams, TinyTemperatureIsGreedy) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(p.greedy());
  p.temperature = 1e-6f;
  EXPECT_TRUE(p.greedy());
  p.temperature = 0.01f;
  EXPECT_FALSE(p.greedy());
}

}  // namespace
}  // namespace serval
