// Row-wise and elementwise kernels of the CPU backend: embedding gather,
// RMSNorm (plain and fused with the residual add), add, SiLU*up, row gather.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace serval {

namespace {

// Parallelize only when there is enough work to pay for waking the threads.
constexpr int64_t kParallelElems = 16384;

// Hugging Face's LlamaRMSNorm in f32: x * rsqrt(mean(x^2) + eps), then * w.
// The sum of squares is accumulated in double so that it does not depend on
// the summation order.
inline void rmsnorm_row(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float variance = float(ss / double(n));
  const float r = 1.0f / std::sqrt(variance + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

}  // namespace

void CpuBackend::embedding(const DeviceWeight& table, const int32_t* ids, const TokenFeed& feed, Tensor out) {
  const float* E = as_cpu(table).data();
  const int64_t D = out.cols;
  float* O = f32(out);
#pragma omp parallel for num_threads(threads_) if (out.numel() > kParallelElems)
  for (int64_t t = 0; t < out.rows; ++t) {
    const int32_t id = feed.source && feed.source[t] >= 0 ? std::max(feed.sampled[feed.source[t]], 0) : ids[t];
    std::memcpy(O + t * D, E + int64_t(id) * D, size_t(D) * sizeof(float));
  }
}

void CpuBackend::rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) {
  const float* W = as_cpu(w).data();
  const int64_t D = x.cols;
  const float* X = f32(x);
  float* O = f32(out);
#pragma omp parallel for num_threads(threads_) if (x.numel() > kParallelElems)
  for (int64_t t = 0; t < x.rows; ++t) rmsnorm_row(X + t * D, W, D, eps, O + t * D);
}

void CpuBackend::add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) {
  const float* W = as_cpu(w).data();
  const int64_t D = residual.cols;
  float* R = f32(residual);
  const float* Dl = f32(delta);
  float* O = f32(out);
#pragma omp parallel for num_threads(threads_) if (residual.numel() > kParallelElems)
  for (int64_t t = 0; t < residual.rows; ++t) {
    float* r = R + t * D;
    const float* d = Dl + t * D;
    for (int64_t i = 0; i < D; ++i) r[i] += d[i];
    rmsnorm_row(r, W, D, eps, O + t * D);
  }
}

void CpuBackend::add(Tensor x, const Tensor& delta) {
  float* X = f32(x);
  const float* Dl = f32(delta);
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(threads_) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) X[i] += Dl[i];
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor out) {
  const float* G = f32(gate);
  const float* U = f32(up);
  float* O = f32(out);
  const int64_t n = gate.numel();
#pragma omp parallel for num_threads(threads_) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) {
    const float g = G[i];
    O[i] = (g / (1.0f + std::exp(-g))) * U[i];
  }
}

void CpuBackend::gather_rows(const Tensor& x, const int32_t* rows, Tensor out) {
  const int64_t D = x.cols;
  const float* X = f32(x);
  float* O = f32(out);
  for (int64_t r = 0; r < out.rows; ++r) std::memcpy(O + r * D, X + int64_t(rows[r]) * D, size_t(D) * sizeof(float));
}

}  // namespace serval
