// Rotary position embedding on the CPU, in place on q and k.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace serval {

namespace {

// Rotates every head of one token. cos/sin hold rope_dim / 2 values.
void rotate_heads(float* x, int64_t num_heads, const RopeParams& p, const float* cos, const float* sin) {
  const int64_t half = p.rope_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* v = x + h * p.head_dim;
    if (p.style == RopeStyle::Neox) {
      // Hugging Face: x * cos + rotate_half(x) * sin over the first rope_dim dims.
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i] + a * sin[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos[i] - b * sin[i];
        v[2 * i + 1] = b * cos[i] + a * sin[i];
      }
    }
  }
}

}  // namespace

void CpuBackend::rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& p) {
  const int64_t half = p.rope_dim / 2;
  const int64_t q_heads = q.cols / p.head_dim, k_heads = k.cols / p.head_dim;
  const int64_t T = q.rows;
#pragma omp parallel num_threads(threads_) if (T * (q.cols + k.cols) > 16384)
  {
    std::vector<float> cs(size_t(2 * half));
    float* cos = cs.data();
    float* sin = cs.data() + half;
#pragma omp for
    for (int64_t t = 0; t < T; ++t) {
      const float pos = float(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        // The angle is rounded to f32 first, as torch computes it; cos/sin of it
        // are then correctly rounded.
        const float angle = pos * p.inv_freq[i];
        cos[i] = float(std::cos(double(angle)));
        sin[i] = float(std::sin(double(angle)));
      }
      rotate_heads(f32(q) + t * q.cols, q_heads, p, cos, sin);
      rotate_heads(f32(k) + t * k.cols, k_heads, p, cos, sin);
    }
  }
}

}  // namespace serval
