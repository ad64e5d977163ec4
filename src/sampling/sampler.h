#pragma once
// Sampler: picks the next token of one sequence from its row of logits, with
// vLLM's semantics:
//   logit_bias added
//   → penalties (repetition, frequency, presence; see penalties.h)
//   → greedy: argmax (lowest id on ties), penalties included
//   → otherwise: temperature, then top-k, top-p, min-p filtering, then a draw
//     from the softmax of what is left, with the request's Rng.
// Filter order is vLLM V0's (top-k, top-p, min-p: top-p's mass is measured
// before min-p removes anything); vLLM V1 applies min-p before top-k/top-p.
// Logprobs, when asked for, are of the raw distribution (see logprobs.h).
//
// One Sampler is reused for many rows: it keeps vocab-sized scratch buffers.
// Not thread-safe; use one per thread.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sampling/logprobs.h"
#include "sampling/penalties.h"
#include "sampling/rng.h"
#include "sampling/sampling_params.h"

namespace serval {

struct SampleResult {
  int32_t token = -1;
  std::optional<Logprobs> logprobs;  // set when params.logprobs >= 0
};

class Sampler {
 public:
  // Throws serval::Error if the logits are empty, contain NaN or +inf, are all
  // -inf, or a token id in the history is outside the vocabulary. Draws exactly
  // one value from `rng` when not greedy, none when greedy.
  // `banned` tokens get logit -inf before anything else (vLLM's min_tokens:
  // EOS and stop tokens while the output is shorter); ids outside the
  // vocabulary are ignored. `allowed`, when not empty, is a bitmask over the
  // vocabulary (SampleSpec::allowed): tokens outside it are banned too.
  // Logprobs stay those of the raw logits.
  SampleResult sample(std::span<const float> logits, const SamplingParams& params,
                      std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                      Rng& rng, std::span<const int32_t> banned = {}, std::span<const uint32_t> allowed = {});
  // The same with the draw made by the caller: `uniform` in [0, 1) is what
  // rng.uniform() would have returned (ignored when greedy). The GPU sampler
  // takes the same draw, so a seed picks the same token on every backend up
  // to rounding of the logits.
  SampleResult sample(std::span<const float> logits, const SamplingParams& params,
                      std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                      double uniform, std::span<const int32_t> banned = {},
                      std::span<const uint32_t> allowed = {});
  // No draw: `token` with the logprobs of the raw distribution and its top
  // `top_n` (a prompt token scored). Throws on the logits sample() refuses
  // or a token outside the vocabulary.
  SampleResult score(std::span<const float> logits, int32_t token, int32_t top_n);

 private:
  int32_t sample_filtered(std::span<const float> x, const SamplingParams& params, double u);
  float kth_largest(std::span<const float> x, float max, int32_t k);
  void apply_top_p(std::span<const float> x, float max, float top_p);

  PenaltyApplier penalties_;
  std::vector<float> work_;          // penalized (and scaled) logits
  std::vector<int32_t> candidates_;  // token ids still in the running
  std::vector<float> values_;        // scratch for selecting the k-th largest value
  std::vector<float> weights_;       // exp(x - max) of the candidates, in order
  std::vector<uint16_t> bucket_of_;  // top-k/top-p: bucket of each token/candidate
  std::vector<int32_t> boundary_;    // top-p: candidates of the boundary bucket
};

}  // namespace serval
