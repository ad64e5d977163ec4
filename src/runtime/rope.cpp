#include "runtime/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace serval {

namespace {

// transformers' _compute_llama3_parameters, one frequency at a time.
float llama3_scaled(float inv_freq, const RopeScaling& s) {
  const double old_context = double(s.original_max_position);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const double wavelen = 2.0 * std::numbers::pi / double(inv_freq);
  if (wavelen < high_freq_wavelen) return inv_freq;              // high frequency: unchanged
  if (wavelen > low_freq_wavelen) return float(inv_freq / s.factor);  // low frequency: scaled
  const double smooth = (old_context / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return float((1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq);
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& config, const std::vector<float>& freq_divisors) {
  const int64_t half = config.rope_dim / 2;
  SERVAL_CHECK(freq_divisors.empty() || int64_t(freq_divisors.size()) == half,
               "rope_freqs.weight has ", freq_divisors.size(), " values, expected rope_dim / 2 = ", half);
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    // torch: arange(0, dim, 2).float() / dim, then base ** that, then 1.0 / that, all f32.
    const float exponent = float(2 * i) / float(config.rope_dim);
    const float power = float(std::pow(double(config.rope_theta), double(exponent)));
    inv[i] = 1.0f / power;
  }
  const RopeScaling& s = config.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    if (!freq_divisors.empty()) {
      SERVAL_CHECK(freq_divisors[i] > 0, "rope_freqs.weight[", i, "] must be positive, got ", freq_divisors[i]);
      inv[i] /= freq_divisors[i];
      if (s.type == RopeScaling::Type::Linear) inv[i] /= s.factor;
    } else if (s.type == RopeScaling::Type::Linear) {
      inv[i] /= s.factor;
    } else if (s.type == RopeScaling::Type::Llama3) {
      inv[i] = llama3_scaled(inv[i], s);
    }
  }
  return inv;
}

}  // namespace serval
