#pragma once
// Penalties on a row of logits, in vLLM's order and with its formulas:
//  1. repetition (HF/CTRL style) over tokens seen in the prompt or the output:
//     a positive logit is divided by the penalty, a negative one multiplied;
//  2. frequency (OpenAI): logit -= frequency_penalty * count in the output;
//  3. presence (OpenAI):  logit -= presence_penalty * (count in the output > 0).
#include <cstdint>
#include <span>
#include <vector>

#include "sampling/sampling_params.h"

namespace serval {

class PenaltyApplier {
 public:
  // Applies the penalties of `params` to `logits` in place. Token ids outside
  // [0, logits.size()) throw serval::Error. Cost: O(prompt + output), not O(vocab).
  void apply(std::span<float> logits, const SamplingParams& params,
             std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids);

 private:
  // Scratch indexed by token id, all zero between calls; only touched entries
  // are reset, so a call never walks the whole vocabulary.
  std::vector<int32_t> output_count_;
  std::vector<uint8_t> seen_;
  std::vector<int32_t> touched_;
};

}  // namespace serval
