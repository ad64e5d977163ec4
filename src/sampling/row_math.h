#pragma once
// Loops over a row of logits (vocab-sized, ~128k), written so the compiler
// vectorizes them: fixed lane counts instead of reductions it may not reorder,
// and an exp that is plain arithmetic instead of a libm call.
#include <cstddef>
#include <cstdint>
#include <span>

namespace serval {

struct RowMax {
  float value;     // largest value (-inf if all are -inf)
  int32_t index;   // lowest index holding it
  bool has_nan;    // some value is NaN (ignored by `value`)
};

RowMax row_max(std::span<const float> x);

// exp(x) for x <= 0 with relative error below 2e-7; exactly 0 for x < -87
// (including -inf), so masked tokens keep weight 0.
inline float exp_nonpositive(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float clamped = x < -87.0f ? -87.0f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (plain arithmetic, so
  // the loop vectorizes without -ffast-math).
  const float kRound = 12582912.0f;
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = clamped - n * kLn2Hi - n * kLn2Lo;  // |r| <= ln2 / 2
  // Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf coefficients).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

// out[i] = exp(x[i] - shift) for shift >= max(x); returns the sum in double.
double exp_shifted(std::span<const float> x, float shift, float* out);

// sum of exp(x[i] - shift) without storing the terms.
double sum_exp_shifted(std::span<const float> x, float shift);

// Inverse-CDF draw over non-negative weights: the first index whose running sum
// exceeds u * sum(w), for u in [0, 1). Never returns an index of weight 0.
// Requires some weight > 0. Fixed summation order, so reproducible.
size_t draw_index(std::span<const float> w, double u);

}  // namespace serval
