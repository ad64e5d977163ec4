#pragma once
// How fully a launch of tiles, one CTA per SM, keeps the SMs busy over its
// waves, and the W tile width whose tile count does that best (CUTLASS's
// swapped decode kernel, cuda_cutlass_kernel.cuh). Host-only arithmetic.
#include <cstdint>
#include <initializer_list>

namespace serval::cuda {

// tiles / (waves x sms): 1 when the last wave is full.
constexpr double wave_fill(int64_t tiles, int sms) {
  if (tiles < 1 || sms < 1) return 0.0;
  return double(tiles) / double((tiles + sms - 1) / sms * sms);
}

// Of `widths`, the W tile whose tiles of m W rows (times `batch`) fill the
// waves of `sms` SMs best; the first listed among equals.
constexpr int best_w_tile(int64_t m, int64_t batch, int sms, std::initializer_list<int> widths) {
  int best = 0;
  double best_fill = -1.0;
  for (int w : widths) {
    const double fill = wave_fill((m + w - 1) / w * batch, sms);
    if (fill > best_fill + 1e-9) best = w, best_fill = fill;
  }
  return best;
}

}  // namespace serval::cuda
