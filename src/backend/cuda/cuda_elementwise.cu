// Row-wise and elementwise kernels: embedding and row gathers, RMSNorm (plain
// and fused with the residual add), add, SiLU*up, bias add. Math in f32, bf16
// in memory. Rows whose width is a multiple of 8 move 16 bytes per access.
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

namespace {

// Eight consecutive values of a bf16 or f32 row as f32, and back: the residual
// stream is f32, everything else bf16 (cuda_backend.h).
__device__ __forceinline__ void load8(const bf16* p, int64_t c, float* f) {
  bf16x8_to_f32(reinterpret_cast<const Bf16x8*>(p)[c], f);
}
__device__ __forceinline__ void load8(const float* p, int64_t c, float* f) {
  const float4 a = reinterpret_cast<const float4*>(p)[2 * c], b = reinterpret_cast<const float4*>(p)[2 * c + 1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(bf16* p, int64_t c, const float* f) {
  reinterpret_cast<Bf16x8*>(p)[c] = f32_to_bf16x8(f);
}
__device__ __forceinline__ void store8(float* p, int64_t c, const float* f) {
  reinterpret_cast<float4*>(p)[2 * c] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[2 * c + 1] = make_float4(f[4], f[5], f[6], f[7]);
}
__device__ __forceinline__ float load1(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load1(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void store1(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ __forceinline__ void store1(float* p, int64_t i, float v) { p[i] = v; }

// out[r, :] = src[idx[r], :] (idx null: r), converting the element type.
template <typename In, typename Out>
__global__ void gather_kernel(const In* src, const int32_t* idx, Out* out, int64_t cols) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const In* s = src + int64_t(idx ? idx[r] : r) * cols;
  Out* o = out + r * cols;
  if (cols % 8 == 0) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      load8(s, c, f);
      store8(o, c, f);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store1(o, c, load1(s, c));
  }
}

// Matches the CPU: out = w * (x * rsqrt(mean(x^2) + eps)). With `delta`, the
// residual x += delta is stored first (in X's type) and normalized as stored.
// The second pass re-reads the row (it is in L1/L2): rows are at most a few
// KB, and registers would cap the width.
template <bool kAdd, typename X>
__global__ void rmsnorm_kernel(X* x, const bf16* delta, const float* w, float eps, bf16* out, int64_t cols) {
  __shared__ float scratch[32];
  // Launched as a programmatic dependent (launch_pdl): wait for the producer of
  // x / delta, and let the next kernel (usually a GEMV that starts streaming
  // its weights before it needs `out`) be scheduled at once.
  pdl_wait();
  pdl_launch_dependents();
  X* xr = x + int64_t(blockIdx.x) * cols;
  const bf16* dr = kAdd ? delta + int64_t(blockIdx.x) * cols : nullptr;
  bf16* orow = out + int64_t(blockIdx.x) * cols;
  const bool vec = cols % 8 == 0;
  float ss = 0.0f;
  if (vec) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      load8(xr, c, f);
      if constexpr (kAdd) {
        float d[8];
        load8(dr, c, d);
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] += d[i];
        store8(xr, c, f);
        load8(xr, c, f);  // normalize what was stored (bf16 rounding, if any)
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += f[i] * f[i];
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float f = load1(xr, c);
      if constexpr (kAdd) {
        store1(xr, c, f + load1(dr, c));
        f = load1(xr, c);
      }
      ss += f * f;
    }
  }
  const float r = rsqrtf(block_sum(ss, scratch) / float(cols) + eps);
  if (vec) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      load8(xr, c, f);
      const float4 w0 = reinterpret_cast<const float4*>(w)[2 * c], w1 = reinterpret_cast<const float4*>(w)[2 * c + 1];
      const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = ws[i] * (f[i] * r);
      store8(orow, c, f);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store1(orow, c, w[c] * (load1(xr, c) * r));
  }
}

template <typename X>
__global__ void add_kernel(X* x, const bf16* d, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store1(x, i, load1(x, i) + __bfloat162float(d[i]));
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

// The residual stream's ops take bf16 or f32 there.
void check_stream(const Tensor& t, const char* what) {
  SERVAL_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, "cuda backend: ", what,
               " expects a bf16 or f32 tensor, got ", dtype_name(t.dtype));
}

template <typename Out>
void launch_gather(const void* src, DType src_dtype, const int32_t* idx, Out* out, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  const dim3 grid{unsigned(rows)}, block{unsigned(row_threads(cols))};
  if (src_dtype == DType::F32)
    launch_pdl(gather_kernel<float, Out>, grid, block, 0, stream, static_cast<const float*>(src), idx, out, cols);
  else
    launch_pdl(gather_kernel<bf16, Out>, grid, block, 0, stream, static_cast<const bf16*>(src), idx, out, cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void gather(const void* src, DType src_dtype, const int32_t* idx, const Tensor& out, cudaStream_t stream) {
  if (out.dtype == DType::F32)
    launch_gather(src, src_dtype, idx, static_cast<float*>(out.data), out.rows, out.cols, stream);
  else
    launch_gather(src, src_dtype, idx, bf(out), out.rows, out.cols, stream);
}

template <bool kAdd>
void launch_rmsnorm(const Tensor& x, const bf16* delta, const float* w, float eps, const Tensor& out,
                    cudaStream_t stream) {
  const dim3 grid(unsigned(x.rows)), block(unsigned(row_threads(x.cols)));
  if (x.dtype == DType::F32)
    launch_pdl(rmsnorm_kernel<kAdd, float>, grid, block, 0, stream, static_cast<float*>(x.data), delta, w, eps,
               bf(out), x.cols);
  else
    launch_pdl(rmsnorm_kernel<kAdd, bf16>, grid, block, 0, stream, bf(x), delta, w, eps, bf(out), x.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::embedding(const DeviceWeight& table, const int32_t* ids, Tensor out) {
  const CudaWeight& w = as_cuda(table);
  SERVAL_CHECK(w.dtype() == DType::BF16 && w.cols() == out.cols, "embedding: table \"", w.name(),
               "\" does not match the output width ", out.cols);
  check_stream(out, "embedding");
  if (out.rows == 0) return;
  gather(w.data(), DType::BF16, ids, out, stream_);
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, Tensor out) {
  check_stream(x, "gather_rows");
  SERVAL_CHECK(out.dtype == x.dtype && out.cols == x.cols, "gather_rows: output must match the input's dtype and width");
  if (out.rows == 0) return;
  gather(x.data, x.dtype, rows, out, stream_);
}

void CudaBackend::rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) {
  check_stream(x, "rmsnorm");
  check_bf16(out, "rmsnorm's output");
  SERVAL_CHECK(out.data != x.data || x.dtype == DType::BF16, "rmsnorm: an f32 input cannot be normalized in place");
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::F32 && cw.cols() == x.cols, "rmsnorm: weight \"", cw.name(), "\" has ",
               cw.cols(), " entries, rows have ", x.cols);
  if (x.rows == 0) return;
  launch_rmsnorm<false>(x, nullptr, static_cast<const float*>(cw.data()), eps, out, stream_);
}

void CudaBackend::add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) {
  check_stream(residual, "add_rmsnorm");
  check_bf16(delta, "add_rmsnorm's delta");
  check_bf16(out, "add_rmsnorm's output");
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::F32 && cw.cols() == residual.cols, "add_rmsnorm: weight \"", cw.name(),
               "\" has ", cw.cols(), " entries, rows have ", residual.cols);
  if (residual.rows == 0) return;
  launch_rmsnorm<true>(residual, bf(delta), static_cast<const float*>(cw.data()), eps, out, stream_);
}

void CudaBackend::add(Tensor x, const Tensor& delta) {
  check_stream(x, "add");
  check_bf16(delta, "add's delta");
  const int64_t n = x.numel();
  if (n == 0) return;
  const dim3 grid(unsigned(grid_for(n, 256, num_sms_))), block(256);
  if (x.dtype == DType::F32)
    launch_pdl(add_kernel<float>, grid, block, 0, stream_, static_cast<float*>(x.data), bf(delta), n);
  else
    launch_pdl(add_kernel<bf16>, grid, block, 0, stream_, bf(x), bf(delta), n);
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
