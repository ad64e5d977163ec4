// y = x @ W^T on the CPU. Decode-sized batches (a few rows) stream W once with
// our own OpenMP kernel, so that reading the weights is the whole cost; larger
// batches (prefill) are a real GEMM through OpenBLAS, split over the OpenMP
// threads by output columns.
#include <cblas.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"

namespace serval {

namespace {

// Rows of x handled by the streaming kernel; above this, sgemm wins.
constexpr int64_t kMaxStreamRows = 8;

// y[t, o] = dot(x[t, :], W[o, :]) for t < T <= kMaxStreamRows: each row of W is
// read once from memory and reused for all T rows of x.
void stream_matmul(const float* X, const float* W, float* Y, int64_t T, int64_t in, int64_t out, int threads) {
  const bool parallel = out * in > (int64_t(1) << 16);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int64_t o = 0; o < out; ++o) {
    const float* w = W + o * in;
    for (int64_t t = 0; t < T; ++t) {
      const float* x = X + t * in;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < in; ++i) acc += w[i] * x[i];
      Y[t * out + o] = acc;
    }
  }
}

// y[t, o] = dot_fixed_order(x[t, :], W[o, :]) for every row: a row's result
// does not depend on how many rows come with it (batch-invariant mode).
void fixed_order_matmul(const float* X, const float* W, float* Y, int64_t T, int64_t in, int64_t out, int threads) {
  const bool parallel = T * out * in > (int64_t(1) << 16);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int64_t o = 0; o < out; ++o)
    for (int64_t t = 0; t < T; ++t) Y[t * out + o] = dot_fixed_order(X + t * in, W + o * in, in);
}

}  // namespace

float dot_fixed_order(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += a[i + j] * b[i + j];
  for (int j = 0; i + j < n; ++j) lane[j] += a[i + j] * b[i + j];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  return lane[0];
}

void CpuBackend::matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) {
  const int64_t T = x.rows, in = x.cols, out = w.rows();
  if (T == 0) return;
  if (observer_ != nullptr) observer_->on_matmul_input(w.name(), f32(x), T, in);
  const float* W = matrix_values(as_cpu(w));
  if (batch_invariant_) {
    fixed_order_matmul(f32(x), W, f32(y), T, in, out, threads_);
  } else if (T <= kMaxStreamRows) {
    stream_matmul(f32(x), W, f32(y), T, in, out, threads_);
  } else {
    // Each thread multiplies by its own slice of W's rows (columns of y) with a
    // single-threaded sgemm: one OpenMP pool for everything. OpenBLAS's own
    // pthread pool would fight OpenMP's spinning workers for the cores.
    const int64_t slices = (T * out * in > (int64_t(1) << 20)) ? threads_ : 1;
    const int64_t per = ((out + slices - 1) / slices + 15) / 16 * 16;
    const float* X = f32(x);
    float* Y = f32(y);
#pragma omp parallel for num_threads(threads_) schedule(static) if (slices > 1)
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t o0 = s * per;
      const int64_t n = std::min(per, out - o0);
      if (n <= 0) continue;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(n), int(in), 1.0f, X, int(in), W + o0 * in,
                  int(in), 0.0f, Y + o0, int(out));
    }
  }
  if (bias != nullptr) {
    const float* b = as_cpu(*bias).data();
    float* Y = f32(y);
#pragma omp parallel for num_threads(threads_) if (T * out > 65536)
    for (int64_t t = 0; t < T; ++t) {
      float* row = Y + t * out;
      for (int64_t o = 0; o < out; ++o) row[o] += b[o];
    }
  }
}

}  // namespace serval
