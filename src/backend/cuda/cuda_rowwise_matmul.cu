// The batch-invariant matmul for inputs the GEMV cannot read (a row width not
// a multiple of 8 values, or rows not 16-byte aligned: stories260K's down
// projection reads rows of 172). One warp per (row, output): its lanes take
// the row's values at a fixed stride, then sum in a fixed butterfly, so a
// row's result is the same bits in a batch of any size. Slow; only odd shapes
// come here, and only with --batch-invariant.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_elem.cuh"

namespace serval::cuda {

namespace {

constexpr int kThreads = 256;

template <typename Out>
__global__ void rowwise_matmul_kernel(const bf16* x, const bf16* w, Out* y, int64_t rows, int64_t outs, int64_t k) {
  const int64_t warp = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  if (warp >= rows * outs) return;  // whole warps: warp is the same in all 32 lanes
  const int64_t r = warp / outs, o = warp % outs;
  const bf16* xr = x + r * k;
  const bf16* wr = w + o * k;
  float acc = 0.0f;
  for (int64_t i = lane; i < k; i += 32) acc = fmaf(__bfloat162float(xr[i]), __bfloat162float(wr[i]), acc);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) store1(y, r * outs + o, acc);
}

}  // namespace

void rowwise_matmul(const Tensor& x, const bf16* w, const Tensor& y, cudaStream_t stream) {
  SERVAL_CHECK(x.dtype == DType::BF16 && (y.dtype == DType::BF16 || y.dtype == DType::F32) && y.rows == x.rows,
               "rowwise_matmul: x [", x.rows, ", ", x.cols, "] (", dtype_name(x.dtype), ") and y [", y.rows, ", ",
               y.cols, "] (", dtype_name(y.dtype), ")");
  const int64_t warps = x.rows * y.cols;
  if (warps == 0) return;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  SERVAL_CHECK(blocks <= int64_t(0x7fffffff), "rowwise_matmul: ", x.rows, " x ", y.cols, " outputs is too many");
  const bf16* xp = static_cast<const bf16*>(x.data);
  if (y.dtype == DType::F32)
    rowwise_matmul_kernel<float><<<unsigned(blocks), kThreads, 0, stream>>>(xp, w, static_cast<float*>(y.data),
                                                                            x.rows, y.cols, x.cols);
  else
    rowwise_matmul_kernel<bf16><<<unsigned(blocks), kThreads, 0, stream>>>(xp, w, static_cast<bf16*>(y.data),
                                                                           x.rows, y.cols, x.cols);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace serval::cuda
