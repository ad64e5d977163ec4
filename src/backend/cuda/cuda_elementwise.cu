// Row-wise and elementwise kernels: embedding and row gathers, RMSNorm (plain
// and fused with the residual add), add, SiLU*up, bias add. Math in f32; in
// memory the activation dtype (bf16, or f32 with --dtype float32) and the f32
// residual stream. Rows whose width is a multiple of 8 move 8 values per access.
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "backend/cuda/cuda_launches.h"

namespace serval::cuda {

namespace {

// out[r, :] = src[idx[r], :] (idx null: r), converting the element type;
// where feed.source[r] >= 0, the row is the token feed.sampled[feed.source[r]].
template <typename In, typename Out>
__global__ void gather_kernel(const In* src, const int32_t* idx, TokenFeed feed, Out* out, int64_t cols) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int32_t from = feed.source ? feed.source[r] : -1;
  const int32_t row = from >= 0 ? max(feed.sampled[from], 0) : idx ? idx[r] : int32_t(r);
  const In* s = src + int64_t(row) * cols;
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

// 1 / sqrt(mean square + eps): f32 outputs (--dtype float32) follow the CPU's
// 1 / sqrt; bf16 ones cannot tell rsqrtf's last-ulp error apart.
template <typename O>
__device__ __forceinline__ float rms_scale(float sum_squares, int64_t cols, float eps) {
  const float var_eps = sum_squares / float(cols) + eps;
  if constexpr (std::is_same_v<O, float>)
    return 1.0f / sqrtf(var_eps);
  else
    return rsqrtf(var_eps);
}

// The value a float becomes when stored as T and read back.
__device__ __forceinline__ float as_stored(float v, const float*) { return v; }
__device__ __forceinline__ float as_stored(float v, const bf16*) { return __bfloat162float(__float2bfloat16(v)); }

// A delta given as two f32 partial sums of a split-k product, `stride` floats
// apart (matmul_add_rmsnorm); read as their sum rounded to the activation
// dtype O, the value the unsplit product would have stored.
using cuda::load1;  // the overloads below must not hide cuda_elem.cuh's
using cuda::load8;
template <typename O>
struct SplitDelta {
  const float* p = nullptr;
  int64_t stride = 0;
};
template <typename O>
__device__ __forceinline__ SplitDelta<O> operator+(SplitDelta<O> d, int64_t off) {
  return {d.p + off, d.stride};
}
template <typename O>
__device__ __forceinline__ void load8(SplitDelta<O> d, int64_t c, float* f) {
  float a[8], b[8];
  load8(d.p, c, a);
  load8(d.p + d.stride, c, b);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = as_stored(a[i] + b[i], static_cast<const O*>(nullptr));
}
template <typename O>
__device__ __forceinline__ float load1(SplitDelta<O> d, int64_t i) {
  return as_stored(d.p[i] + d.p[d.stride + i], static_cast<const O*>(nullptr));
}

// Chunk c of row xr into f, with delta's chunk added and the sum stored back
// first when kAdd (f then holds the values as stored); returns ss plus the
// squares of the 8 values, added in order. D: a pointer of the activation
// dtype, or SplitDelta.
template <bool kAdd, typename X, typename D>
__device__ __forceinline__ float residual_chunk(X* xr, D dr, int64_t c, float (&f)[8], float ss) {
  load8(xr, c, f);
  if constexpr (kAdd) {
    float d[8];
    load8(dr, c, d);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] += d[i];
    store8(xr, c, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = as_stored(f[i], xr);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += f[i] * f[i];
  return ss;
}

// Matches the CPU: out = w * (x * rsqrt(mean(x^2) + eps)). With `delta`, the
// residual x += delta is stored first (in X's type) and normalized as stored.
// Rows of up to one 8-value chunk per thread (cols <= 8192) keep their chunk
// in registers from the load to the output, so the row is read once (a
// decode step's norms are latency-bound); wider rows take a second pass that
// re-reads the row. O is the activation dtype (delta's and out's); out may
// alias x when X == O (each thread rewrites only what it read). Both paths sum
// the squares in the same order (a thread's chunks in turn, then block_sum).
template <bool kAdd, typename X, typename O, typename D = const O*>
__global__ void rmsnorm_kernel(X* x, D delta, const float* w, float eps, O* out, int64_t cols) {
  __shared__ float scratch[32];
  X* xr = x + int64_t(blockIdx.x) * cols;
  const D dr = kAdd ? delta + int64_t(blockIdx.x) * cols : D{};
  O* orow = out + int64_t(blockIdx.x) * cols;
  const bool vec = cols % 8 == 0;
  if (vec && cols / 8 <= blockDim.x) {
    const int64_t c = threadIdx.x;
    const bool live = c < cols / 8;
    float ws[8] = {}, f[8] = {};
    if (live) load8(w, c, ws);  // the weight is no kernel's output: read it before waiting
    // Launched as a programmatic dependent (launch_pdl): wait for the producer
    // of x / delta, and let the next kernel (usually a GEMV that starts
    // streaming its weights before it needs `out`) be scheduled at once.
    pdl_wait();
    pdl_launch_dependents();
    const float ss = live ? residual_chunk<kAdd>(xr, dr, c, f, 0.0f) : 0.0f;
    const float r = rms_scale<O>(block_sum(ss, scratch), cols, eps);
    if (live) {
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = ws[i] * (f[i] * r);
      store8(orow, c, f);
    }
    return;
  }
  pdl_wait();
  pdl_launch_dependents();
  float ss = 0.0f;
  if (vec) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      ss = residual_chunk<kAdd>(xr, dr, c, f, ss);
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
  const float r = rms_scale<O>(block_sum(ss, scratch), cols, eps);
  if (vec) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      float f[8];
      load8(xr, c, f);
      float ws[8];
      load8(w, c, ws);
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = ws[i] * (f[i] * r);
      store8(orow, c, f);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store1(orow, c, w[c] * (load1(xr, c) * r));
  }
}

// x += d: X is the residual's type, D the activation dtype.
template <typename X, typename D>
__global__ void add_kernel(X* x, const D* d, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store1(x, i, load1(x, i) + load1(d, i));
}

// silu(a) = a / (1 + e^-a). f32 activations (--dtype float32) take the
// accurate expf, as the CPU does; bf16 ones the fast intrinsic.
template <typename T>
__device__ __forceinline__ float silu(float a) {
  if constexpr (std::is_same_v<T, float>)
    return a / (1.0f + expf(-a));
  else
    return a / (1.0f + __expf(-a));
}

template <typename T>
__global__ void silu_mul_kernel(const T* g, const T* u, T* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store1(o, i, silu<T>(load1(g, i)) * load1(u, i));
}

// Chunks of 8 elements of type T: n8 = n / 8. Output chunk i reads chunk
// i * step of g and of u (2: an interleaved gate/up pair's product, whose
// chunks alternate, cuda_gate_up_layout.cuh).
template <typename T>
__global__ void silu_mul_vec_kernel(const Vec8<T>* g, const Vec8<T>* u, Vec8<T>* o, int64_t n8, int step) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    vec8_to_f32(g[i * step], a);
    vec8_to_f32(u[i * step], b);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = silu<T>(a[k]) * b[k];
    o[i] = f32_to_vec8<T>(a);
  }
}

template <typename T>
__global__ void bias_kernel(T* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store1(y, i, load1(y, i) + b[i % cols]);
}

int row_threads(int64_t cols) {
  const int64_t work = cols % 8 == 0 ? cols / 8 : cols;
  return int(std::min<int64_t>(1024, std::max<int64_t>(32, (work + 31) / 32 * 32)));
}

int grid_for(int64_t n, int threads, int sms) {
  return int(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, int64_t(sms) * 16)));
}

// Activations (not the residual stream) must be in the backend's dtype.
void check_act(const Tensor& t, DType act, const char* what) {
  SERVAL_CHECK(t.dtype == act, "cuda backend: ", what, " expects ", dtype_name(act), " tensors, got ",
               dtype_name(t.dtype));
}

// The residual stream's ops take bf16 or f32 there.
void check_stream(const Tensor& t, const char* what) {
  SERVAL_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, "cuda backend: ", what,
               " expects a bf16 or f32 tensor, got ", dtype_name(t.dtype));
}

float* f32(const Tensor& t) { return static_cast<float*>(t.data); }

template <typename Out>
void launch_gather(const void* src, DType src_dtype, const int32_t* idx, const TokenFeed& feed, Out* out, int64_t rows,
                   int64_t cols, const Launch& on) {
  const dim3 grid{unsigned(rows)}, block{unsigned(row_threads(cols))};
  if (src_dtype == DType::F32)
    launch_pdl(gather_kernel<float, Out>, grid, block, 0, on, static_cast<const float*>(src), idx, feed, out, cols);
  else
    launch_pdl(gather_kernel<bf16, Out>, grid, block, 0, on, static_cast<const bf16*>(src), idx, feed, out, cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void gather(const void* src, DType src_dtype, const int32_t* idx, const Tensor& out, const Launch& on,
            const TokenFeed& feed = {}) {
  if (out.dtype == DType::F32)
    launch_gather(src, src_dtype, idx, feed, f32(out), out.rows, out.cols, on);
  else
    launch_gather(src, src_dtype, idx, feed, bf(out), out.rows, out.cols, on);
}

// out (and delta) are of type O; x is bf16 or f32.
template <bool kAdd, typename O>
void launch_rmsnorm_kernel(const Tensor& x, const O* delta, const float* w, float eps, O* out, const Launch& on) {
  const dim3 grid(unsigned(x.rows)), block(unsigned(row_threads(x.cols)));
  if (x.dtype == DType::F32)
    launch_pdl(rmsnorm_kernel<kAdd, float, O>, grid, block, 0, on, f32(x), delta, w, eps, out, x.cols);
  else
    launch_pdl(rmsnorm_kernel<kAdd, bf16, O>, grid, block, 0, on, bf(x), delta, w, eps, out, x.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

template <bool kAdd>
void rmsnorm_dispatch(const Tensor& x, const Tensor* delta, const float* w, float eps, const Tensor& out,
                      const Launch& on) {
  if (out.dtype == DType::F32)
    launch_rmsnorm_kernel<kAdd, float>(x, delta ? f32(*delta) : nullptr, w, eps, f32(out), on);
  else
    launch_rmsnorm_kernel<kAdd, bf16>(x, delta ? bf(*delta) : nullptr, w, eps, bf(out), on);
}

template <typename T>
void launch_silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out, int sms, cudaStream_t stream) {
  const int64_t n = gate.numel();
  const T* g = static_cast<const T*>(gate.data);
  const T* u = static_cast<const T*>(up.data);
  T* o = static_cast<T*>(out.data);
  if (n % 8 == 0)
    silu_mul_vec_kernel<T><<<grid_for(n / 8, 256, sms), 256, 0, stream>>>(
        reinterpret_cast<const Vec8<T>*>(g), reinterpret_cast<const Vec8<T>*>(u), reinterpret_cast<Vec8<T>*>(o), n / 8,
        1);
  else
    silu_mul_kernel<T><<<grid_for(n, 256, sms), 256, 0, stream>>>(g, u, o, n);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::embedding(const DeviceWeight& table, const int32_t* ids, const TokenFeed& feed, Tensor out) {
  const CudaWeight& w = as_cuda(table);
  SERVAL_CHECK((w.dtype() == DType::BF16 || w.dtype() == DType::F32) && w.cols() == out.cols, "embedding: table \"",
               w.name(), "\" does not match the output width ", out.cols);
  check_stream(out, "embedding");
  if (out.rows == 0) return;
  dev_.bind();
  gather(w.data(), w.dtype(), ids, out, launch_on(dev_, cfg_), feed);
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, Tensor out) {
  check_stream(x, "gather_rows");
  SERVAL_CHECK(out.dtype == x.dtype && out.cols == x.cols, "gather_rows: output must match the input's dtype and width");
  if (out.rows == 0) return;
  dev_.bind();
  gather(x.data, x.dtype, rows, out, launch_on(dev_, cfg_));
}

void CudaBackend::rmsnorm(const Tensor& x, const DeviceWeight& w, float eps, Tensor out) {
  check_stream(x, "rmsnorm");
  check_act(out, cfg_.act_dtype, "rmsnorm's output");
  SERVAL_CHECK(out.data != x.data || x.dtype == out.dtype,
               "rmsnorm: a ", dtype_name(x.dtype), " input cannot be normalized in place into ", dtype_name(out.dtype));
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::F32 && cw.cols() == x.cols, "rmsnorm: weight \"", cw.name(), "\" has ",
               cw.cols(), " entries, rows have ", x.cols);
  if (x.rows == 0) return;
  dev_.bind();
  rmsnorm_dispatch<false>(x, nullptr, static_cast<const float*>(cw.data()), eps, out, launch_on(dev_, cfg_));
}

void CudaBackend::add_rmsnorm(Tensor residual, const Tensor& delta, const DeviceWeight& w, float eps, Tensor out) {
  check_stream(residual, "add_rmsnorm");
  check_act(delta, cfg_.act_dtype, "add_rmsnorm's delta");
  check_act(out, cfg_.act_dtype, "add_rmsnorm's output");
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::F32 && cw.cols() == residual.cols, "add_rmsnorm: weight \"", cw.name(),
               "\" has ", cw.cols(), " entries, rows have ", residual.cols);
  if (residual.rows == 0) return;
  dev_.bind();
  rmsnorm_dispatch<true>(residual, &delta, static_cast<const float*>(cw.data()), eps, out, launch_on(dev_, cfg_));
}

void CudaBackend::add(Tensor x, const Tensor& delta) {
  check_stream(x, "add");
  check_act(delta, cfg_.act_dtype, "add's delta");
  const int64_t n = x.numel();
  if (n == 0) return;
  dev_.bind();
  const dim3 grid(unsigned(grid_for(n, 256, dev_.num_sms()))), block(256);
  const Launch on = launch_on(dev_, cfg_);
  if (delta.dtype == DType::F32) {
    if (x.dtype == DType::F32)
      launch_pdl(add_kernel<float, float>, grid, block, 0, on, f32(x), static_cast<const float*>(delta.data), n);
    else
      launch_pdl(add_kernel<bf16, float>, grid, block, 0, on, bf(x), static_cast<const float*>(delta.data), n);
  } else {
    if (x.dtype == DType::F32)
      launch_pdl(add_kernel<float, bf16>, grid, block, 0, on, f32(x), bf(delta), n);
    else
      launch_pdl(add_kernel<bf16, bf16>, grid, block, 0, on, bf(x), bf(delta), n);
  }
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor out) {
  check_act(gate, cfg_.act_dtype, "silu_mul");
  check_act(up, cfg_.act_dtype, "silu_mul");
  check_act(out, cfg_.act_dtype, "silu_mul's output");
  if (gate.numel() == 0) return;
  dev_.bind();
  if (cfg_.act_dtype == DType::F32)
    launch_silu_mul<float>(gate, up, out, dev_.num_sms(), dev_.stream());
  else
    launch_silu_mul<bf16>(gate, up, out, dev_.num_sms(), dev_.stream());
}

void launch_silu_mul_interleaved(const void* product, Tensor out, int sms, cudaStream_t stream) {
  check_act(out, DType::BF16, "silu_mul_interleaved's output");
  SERVAL_CHECK(out.cols % kGateUpGroupRows == 0, "silu_mul_interleaved: ", out.cols, " outputs per row are not in ",
               "groups of ", kGateUpGroupRows);
  const int64_t n8 = out.numel() / 8;
  if (n8 == 0) return;
  const auto* y = static_cast<const Vec8<bf16>*>(product);
  silu_mul_vec_kernel<bf16><<<grid_for(n8, 256, sms), 256, 0, stream>>>(
      y, y + 1, reinterpret_cast<Vec8<bf16>*>(out.data), n8, 2);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void launch_rmsnorm(const Tensor& x, const float* w, float eps, Tensor out, const Launch& on) {
  if (x.rows == 0) return;
  rmsnorm_dispatch<false>(x, nullptr, w, eps, out, on);
}

void launch_split_add_rmsnorm(const Tensor& residual, const float* partials, int64_t stride, const float* w,
                              float eps, const Tensor& out, const Launch& on) {
  const dim3 grid(unsigned(residual.rows)), block(unsigned(row_threads(residual.cols)));
  launch_pdl(rmsnorm_kernel<true, float, bf16, SplitDelta<bf16>>, grid, block, 0, on, f32(residual),
             SplitDelta<bf16>{partials, stride}, w, eps, bf(out), residual.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void add_bias(cudaStream_t stream, int sms, Tensor y, const float* bias) {
  const int64_t n = y.numel();
  if (n == 0) return;
  if (y.dtype == DType::F32)
    bias_kernel<float><<<grid_for(n, 256, sms), 256, 0, stream>>>(f32(y), bias, y.rows, y.cols);
  else
    bias_kernel<bf16><<<grid_for(n, 256, sms), 256, 0, stream>>>(bf(y), bias, y.rows, y.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace serval::cuda
