#pragma once
// Log-probabilities reported to the user.
//
// Choice (as vLLM's default logprobs_mode "raw_logprobs"): logprobs are those
// of the model's raw distribution, log_softmax of the logits *before*
// penalties, temperature and top-k/top-p/min-p filtering. They therefore
// describe what the model predicted, not the (possibly truncated) distribution
// the token was drawn from, and are the same whatever the sampling parameters.
#include <cstdint>
#include <span>
#include <vector>

namespace serval {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct Logprobs {
  float chosen = 0.0f;              // logprob of the sampled token
  int32_t chosen_rank = 0;          // 1 + number of tokens with a larger logit
  std::vector<TokenLogprob> top;    // n most likely tokens, most likely first
};

// log(sum(exp(logits))), computed stably (max-shifted, double accumulation).
double log_sum_exp(std::span<const float> logits);

// Logprob of `chosen` and the `top_n` most likely tokens of the raw distribution
// (ties: lower token id first). O(vocab * top_n) worst case, O(vocab) typical.
Logprobs compute_logprobs(std::span<const float> logits, int32_t chosen, int32_t top_n);

}  // namespace serval
