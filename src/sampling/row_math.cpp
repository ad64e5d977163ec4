#include "sampling/row_math.h"

#include <algorithm>
#include <limits>

namespace serval {
namespace {
constexpr size_t kLanes = 16;
}

RowMax row_max(std::span<const float> x) {
  const size_t n = x.size();
  float lane_max[kLanes];
  int32_t nan_count[kLanes] = {};
  for (float& m : lane_max) m = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float v = x[i + l];
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
      nan_count[l] += v != v;
    }
  }
  RowMax r{-std::numeric_limits<float>::infinity(), -1, false};
  for (; i < n; ++i) {
    r.value = x[i] > r.value ? x[i] : r.value;
    r.has_nan |= x[i] != x[i];
  }
  for (size_t l = 0; l < kLanes; ++l) {
    r.value = lane_max[l] > r.value ? lane_max[l] : r.value;
    r.has_nan |= nan_count[l] != 0;
  }
  for (size_t j = 0; j < n; ++j) {
    if (x[j] == r.value) {
      r.index = int32_t(j);
      break;
    }
  }
  return r;
}

double exp_shifted(std::span<const float> x, float shift, float* out) {
  const size_t n = x.size();
  for (size_t i = 0; i < n; ++i) out[i] = exp_nonpositive(x[i] - shift);
  // Lane sums in double keep the total accurate for 128k terms.
  double lane_sum[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane_sum[l] += out[i + l];
  double sum = 0.0;
  for (; i < n; ++i) sum += out[i];
  for (double s : lane_sum) sum += s;
  return sum;
}

double sum_exp_shifted(std::span<const float> x, float shift) {
  // Through a small buffer, so the exp loop is the same vectorized one.
  constexpr size_t kChunk = 1024;
  float buffer[kChunk];
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); i += kChunk)
    sum += exp_shifted(x.subspan(i, std::min(kChunk, x.size() - i)), shift, buffer);
  return sum;
}

namespace {
double block_sum(const float* w) {
  double s = 0.0;
  for (size_t l = 0; l < kLanes; ++l) s += w[l];
  return s;
}
}  // namespace

size_t draw_index(std::span<const float> w, double u) {
  const size_t n = w.size();
  double total = 0.0;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) total += block_sum(&w[i]);
  for (; i < n; ++i) total += w[i];
  const double target = u * total;
  // Skip whole blocks, then walk the block where the running sum crosses target.
  double cum = 0.0;
  i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const double b = block_sum(&w[i]);
    if (cum + b > target) break;
    cum += b;
  }
  size_t last_positive = n;
  for (; i < n; ++i) {
    if (w[i] > 0.0f) last_positive = i;
    cum += w[i];
    if (target < cum && w[i] > 0.0f) return i;
  }
  // Only reachable through rounding when u is within an ulp of 1.
  if (last_positive == n)
    for (size_t j = 0; j < n; ++j)
      if (w[j] > 0.0f) last_positive = j;
  return last_positive;
}

}  // namespace serval
