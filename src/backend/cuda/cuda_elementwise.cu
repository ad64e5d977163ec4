// Row-wise and elementwise kernels: embedding and row gathers, RMSNorm (plain
// and fused with the residual add), add, SiLU*up, bias add. Math in f32, bf16
// in memory. Rows whose width is a multiple of 8 move 16 bytes per access.
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

namespace {

// out[r, :] = src[idx[r], :] (idx null: r).
__global__ void gather_kernel(const bf16* src, const int32_t* idx, bf16* out, int64_t cols) {
  const int64_t r = blockIdx.x;
  const bf16* s = src + int64_t(idx ? idx[r] : r) * cols;
  bf16* o = out + r * cols;
  if (cols % 8 == 0) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x)
      reinterpret_cast<Bf16x8*>(o)[c] = reinterpret_cast<const Bf16x8*>(s)[c];
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = s[c];
  }
}

// Matches the CPU: out = w * (x * rsqrt(mean(x^2) + eps)). With `delta`, the
// residual x += delta is stored first (rounded to bf16) and normalized as stored.
template <bool kAdd, bool kVec>
__global__ void rmsnorm_kernel(bf16* x, const bf16* delta, const float* w, float eps, bf16* out, int64_t cols) {
  __shared__ float scratch[32];
  bf16* xr = x + int64_t(blockIdx.x) * cols;
  bf16* orow = out + int64_t(blockIdx.x) * cols;
  float ss = 0.0f;
  if constexpr (kVec) {
    // The second pass re-reads the row (it is in L1/L2): rows are at most a few
    // KB, and registers would cap the width.
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      Bf16x8 v = reinterpret_cast<const Bf16x8*>(xr)[c];
      bf16x8_to_f32(v, f);
      if constexpr (kAdd) {
        float d[8];
        bf16x8_to_f32(reinterpret_cast<const Bf16x8*>(delta + int64_t(blockIdx.x) * cols)[c], d);
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] += d[i];
        v = f32_to_bf16x8(f);
        reinterpret_cast<Bf16x8*>(xr)[c] = v;
        bf16x8_to_f32(v, f);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += f[i] * f[i];
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float f = __bfloat162float(xr[c]);
      if constexpr (kAdd) {
        const bf16 s = __float2bfloat16(f + __bfloat162float(delta[int64_t(blockIdx.x) * cols + c]));
        xr[c] = s;
        f = __bfloat162float(s);
      }
      ss += f * f;
    }
  }
  const float r = rsqrtf(block_sum(ss, scratch) / float(cols) + eps);
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      bf16x8_to_f32(reinterpret_cast<const Bf16x8*>(xr)[c], f);
      const float4 w0 = reinterpret_cast<const float4*>(w)[2 * c], w1 = reinterpret_cast<const float4*>(w)[2 * c + 1];
      const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = ws[i] * (f[i] * r);
      reinterpret_cast<Bf16x8*>(orow)[c] = f32_to_bf16x8(f);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      orow[c] = __float2bfloat16(w[c] * (__bfloat162float(xr[c]) * r));
  }
}

__global__ void add_kernel(bf16* x, const bf16* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(d[i]));
}

__global__ void silu_mul_kernel(const bf16* g, const bf16* u, bf16* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = __bfloat162float(g[i]);
    o[i] = __float2bfloat16((a / (1.0f + __expf(-a))) * __bfloat162float(u[i]));
  }
}

__global__ void silu_mul_vec_kernel(const Bf16x8* g, const Bf16x8* u, Bf16x8* o, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    bf16x8_to_f32(g[i], a);
    bf16x8_to_f32(u[i], b);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = (a[k] / (1.0f + __expf(-a[k]))) * b[k];
    o[i] = f32_to_bf16x8(a);
  }
}

__global__ void bias_kernel(bf16* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + b[i % cols]);
}

int row_threads(int64_t cols) {
  const int64_t work = cols % 8 == 0 ? cols / 8 : cols;
  return int(std::min<int64_t>(1024, std::max<int64_t>(32, (work + 31) / 32 * 32)));
}

int grid_for(int64_t n, int threads, int sms) {
  return int(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, int64_t(sms) * 16)));
}

void check_bf16(const Tensor& t, const char* what) {
  SERVAL_CHECK(t.dtype == DType::BF16, "cuda backend: ", what, " expects bf16 tensors, got ", dtype_name(t.dtype));
}

}  // namespace

void CudaBackend::embedding(const DeviceWeight& table, const int32_t* ids, Tensor out) {
  const CudaWeight& w = as_cuda(table);
  SERVAL_CHECK(w.dtype() == DType::BF16 && w.cols() == out.cols, "embedding: table \"", w.name(),
               "\" does not match the output width ", out.cols);
  if (out.rows == 0) return;
  gather_kernel<<<unsigned(out.rows), row_threads(out.cols), 0, stream_>>>(static_cast<const bf16*>(w.data()), ids,
                                                                           bf(out), out.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, Tensor out) {
  check_bf16(x, "gather_rows");
  if (out.rows == 0) return;
  gather_kernel<<<unsigned(out.rows), row_threads(out.cols), 0, stream_>>>(bf(x), rows, bf(out), out.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) {
  check_bf16(x, "rmsnorm");
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::F32 && cw.cols() == x.cols, "rmsnorm: weight \"", cw.name(), "\" has ",
               cw.cols(), " entries, rows have ", x.cols);
  if (x.rows == 0) return;
  const auto* W = static_cast<const float*>(cw.data());
  if (x.cols % 8 == 0)
    rmsnorm_kernel<false, true><<<unsigned(x.rows), row_threads(x.cols), 0, stream_>>>(bf(x), nullptr, W, eps,
                                                                                       bf(out), x.cols);
  else
    rmsnorm_kernel<false, false><<<unsigned(x.rows), row_threads(x.cols), 0, stream_>>>(bf(x), nullptr, W, eps,
                                                                                        bf(out), x.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) {
  check_bf16(residual, "add_rmsnorm");
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::F32 && cw.cols() == residual.cols, "add_rmsnorm: weight \"", cw.name(),
               "\" has ", cw.cols(), " entries, rows have ", residual.cols);
  if (residual.rows == 0) return;
  const auto* W = static_cast<const float*>(cw.data());
  if (residual.cols % 8 == 0)
    rmsnorm_kernel<true, true><<<unsigned(residual.rows), row_threads(residual.cols), 0, stream_>>>(
        bf(residual), bf(delta), W, eps, bf(out), residual.cols);
  else
    rmsnorm_kernel<true, false><<<unsigned(residual.rows), row_threads(residual.cols), 0, stream_>>>(
        bf(residual), bf(delta), W, eps, bf(out), residual.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::add(Tensor x, const Tensor& delta) {
  check_bf16(x, "add");
  const int64_t n = x.numel();
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256, num_sms_), 256, 0, stream_>>>(bf(x), bf(delta), n);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor out) {
  check_bf16(gate, "silu_mul");
  const int64_t n = gate.numel();
  if (n == 0) return;
  if (n % 8 == 0) {
    silu_mul_vec_kernel<<<grid_for(n / 8, 256, num_sms_), 256, 0, stream_>>>(
        static_cast<const Bf16x8*>(gate.data), static_cast<const Bf16x8*>(up.data), static_cast<Bf16x8*>(out.data),
        n / 8);
  } else {
    silu_mul_kernel<<<grid_for(n, 256, num_sms_), 256, 0, stream_>>>(bf(gate), bf(up), bf(out), n);
  }
  SERVAL_CUDA_LAUNCH_CHECK();
}

// Used by matmul for biased projections (qwen2).
void add_bias(cudaStream_t stream, int sms, Tensor y, const float* bias) {
  const int64_t n = y.numel();
  if (n == 0) return;
  bias_kernel<<<grid_for(n, 256, sms), 256, 0, stream>>>(bf(y), bias, y.rows, y.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace serval::cuda
