#include "sampling/sampling_params.h"

#include <cmath>

#include "core/error.h"

namespace serval {

void SamplingParams::validate() const {
  // NaN fails every comparison below, so each check is written so that NaN is rejected.
  SERVAL_CHECK(temperature >= 0.0f && temperature <= kMaxTemperature,
               "temperature must be in [0, ", kMaxTemperature, "], got ", temperature);
  SERVAL_CHECK(top_p >= 0.0f && top_p <= 1.0f, "top_p must be in [0, 1], got ", top_p);
  SERVAL_CHECK(top_k == -1 || top_k >= 0,
               "top_k must be -1 or 0 (disabled) or at least 1, got ", top_k);
  SERVAL_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got ", min_p);
  SERVAL_CHECK(repetition_penalty > 0.0f && repetition_penalty <= 10.0f,
               "repetition_penalty must be in (0, 10], got ", repetition_penalty);
  SERVAL_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
               "presence_penalty must be in [-2, 2], got ", presence_penalty);
  SERVAL_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
               "frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  SERVAL_CHECK(logprobs >= -1 && logprobs <= kMaxLogprobs, "logprobs must be in [0, ",
               kMaxLogprobs, "] (or -1 for none), got ", logprobs);
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto& [id, bias] = logit_bias[i];
    SERVAL_CHECK(id >= 0, "logit_bias: token id ", id, " is negative");
    SERVAL_CHECK(bias >= -kMaxLogitBias && bias <= kMaxLogitBias, "logit_bias: the bias of token ", id,
                 " must be in [-", kMaxLogitBias, ", ", kMaxLogitBias, "], got ", bias);
    for (size_t j = 0; j < i; ++j)
      SERVAL_CHECK(logit_bias[j].first != id, "logit_bias: token id ", id, " is given twice");
  }
  SERVAL_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= kMaxLogprobs, "prompt_logprobs must be in [0, ",
               kMaxLogprobs, "] (or -1 for none), got ", prompt_logprobs);
}

}  // namespace serval
