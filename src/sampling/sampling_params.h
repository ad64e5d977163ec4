#pragma once
// Per-request sampling parameters, with the OpenAI/vLLM meanings.
#include <cstdint>
#include <optional>

namespace serval {

struct SamplingParams {
  float temperature = 1.0f;        // 0: greedy
  float top_p = 1.0f;              // (0, 1]
  int32_t top_k = 0;               // 0 or -1: disabled
  float min_p = 0.0f;              // [0, 1]
  float repetition_penalty = 1.0f; // > 0; 1 disables (HF/vLLM: over prompt and output)
  float presence_penalty = 0.0f;   // [-2, 2], over output tokens
  float frequency_penalty = 0.0f;  // [-2, 2], over output tokens
  std::optional<uint64_t> seed;    // reproducible sampling when set
  int32_t logprobs = -1;           // -1: none; n >= 0: chosen token's logprob + top n

  bool greedy() const { return temperature == 0.0f; }
  // Throws serval::Error naming the first parameter out of range.
  void validate() const;
};

}  // namespace serval
