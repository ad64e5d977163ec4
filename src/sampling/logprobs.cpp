#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "sampling/row_math.h"

namespace serval {

double log_sum_exp(std::span<const float> logits) {
  const float max = row_max(logits).value;
  if (max == -std::numeric_limits<float>::infinity()) return max;
  return double(max) + std::log(sum_exp_shifted(logits, max));
}

Logprobs compute_logprobs(std::span<const float> logits, int32_t chosen, int32_t top_n) {
  const int64_t vocab = int64_t(logits.size());
  SERVAL_CHECK(chosen >= 0 && chosen < vocab, "chosen token ", chosen,
               " is outside the vocabulary [0, ", vocab, ")");
  const double lse = log_sum_exp(logits);
  Logprobs out;
  out.chosen = float(double(logits[chosen]) - lse);
  int32_t larger = 0;
  const float chosen_logit = logits[chosen];
  for (float x : logits) larger += x > chosen_logit ? 1 : 0;
  out.chosen_rank = larger + 1;

  // Keep the best n seen so far, sorted; a candidate enters only if it beats the
  // current last one, which for a real distribution is rare after the start.
  const size_t n = size_t(std::clamp<int64_t>(top_n, 0, vocab));
  std::vector<TokenLogprob>& top = out.top;
  top.reserve(n + 1);
  if (n > 0) {
    for (int32_t id = 0; id < vocab; ++id) {
      const float x = logits[id];
      if (top.size() == n && !(x > top.back().logprob)) continue;
      // Insert after equal values, so the lower id (seen first) stays ahead.
      auto pos = std::upper_bound(top.begin(), top.end(), x,
                                  [](float v, const TokenLogprob& t) { return v > t.logprob; });
      top.insert(pos, TokenLogprob{id, x});
      if (top.size() > n) top.pop_back();
    }
  }
  for (TokenLogprob& t : top) t.logprob = float(double(t.logprob) - lse);
  return out;
}

}  // namespace serval
