#pragma once
// Per-request sampling parameters, with the OpenAI/vLLM meanings.
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace serval {

struct SamplingParams {
  float temperature = 1.0f;        // [0, 100]; below kGreedyTemperature: greedy
  float top_p = 1.0f;              // [0, 1]; 0: the smallest nucleus (see nucleus_mass)
  int32_t top_k = 0;               // 0 or -1: disabled
  float min_p = 0.0f;              // [0, 1]
  float repetition_penalty = 1.0f; // (0, 10]; 1 disables (HF/vLLM: over prompt and output)
  float presence_penalty = 0.0f;   // [-2, 2], over output tokens
  float frequency_penalty = 0.0f;  // [-2, 2], over output tokens
  std::optional<uint64_t> seed;    // reproducible sampling when set
  int32_t logprobs = -1;           // -1: none; n in [0, 20]: chosen token's logprob + top n
  // -1: none; n in [0, 20]: each prompt token's logprob given the tokens
  // before it, with the top n (vLLM's prompt_logprobs; the first has none).
  int32_t prompt_logprobs = -1;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the
  // logits before penalties and sampling (vLLM's order), distinct ids.
  // Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Temperatures this small are treated as greedy (as vLLM does), since
  // dividing logits by them would only amplify rounding noise.
  static constexpr float kGreedyTemperature = 1e-5f;
  static constexpr float kMaxTemperature = 100.0f;
  static constexpr int32_t kMaxLogprobs = 20;
  static constexpr float kMaxLogitBias = 100.0f;

  bool greedy() const { return temperature < kGreedyTemperature; }
  // The probability mass top-p keeps. OpenAI allows top_p 0 (vLLM refuses
  // it); it means the smallest nucleus, the most likely token alone, which
  // the samplers get from the smallest positive mass.
  float nucleus_mass() const { return top_p > 0.0f ? top_p : std::numeric_limits<float>::min(); }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // Throws serval::Error naming the first parameter out of range, e.g.
  // "top_p must be in [0, 1], got 1.5".
  void validate() const;
};

}  // namespace serval
