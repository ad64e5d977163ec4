#include "model/rope_factors.h"

#include <cmath>

#include "core/error.h"

namespace serval {

std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  SERVAL_CHECK(rs.type == RopeScaling::Type::Llama3, "llama3_rope_factors: rope scaling is not llama3");
  SERVAL_CHECK(rs.high_freq_factor != rs.low_freq_factor, "llama3 rope scaling: high_freq_factor (",
               rs.high_freq_factor, ") must differ from low_freq_factor");
  const double old_ctx = double(rs.original_max_position);
  const double low_wavelen = old_ctx / rs.low_freq_factor;
  const double high_wavelen = old_ctx / rs.high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < c.rope_dim; i += 2) {
    const double freq = 1.0 / std::pow(double(c.rope_theta), double(i) / double(c.rope_dim));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(rs.factor);
    } else {
      const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      factors.push_back(float(1.0 / ((1 - smooth) / rs.factor + smooth)));
    }
  }
  return factors;
}

}  // namespace serval
