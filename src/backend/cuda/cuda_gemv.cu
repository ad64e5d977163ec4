// y = x @ W^T for a few rows of x (decode batches of up to 8 tokens): a
// memory-bound stream over W, which cuBLASLt's small-N kernels (split-K plus a
// reduction kernel) read at well under full bandwidth. One warp per output
// row; each lane keeps several 16-byte loads of W in flight and reuses each
// for all T rows of x, which stay in L1/L2. Several weights that read the same
// x (q/k/v, gate/up) go in one launch: a short kernel spends a good part of
// its time ramping up and draining.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

namespace {

constexpr int kGemvThreads = 256;
constexpr int kUnroll = 4;

// Up to three weights [rows[i], in] with outputs [T, rows[i]], all reading x.
struct GemvSegments {
  const bf16* w[3];
  void* y[3];
  int rows[3];
  int n;
};

// The grid is sized to what the SMs hold at once and each warp strides over
// rows: a grid of one warp per row ends in a partial wave, which idles a good
// part of the GPU for the short time these kernels run.
template <int T, typename Out>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const bf16* __restrict__ x, GemvSegments seg, int in,
                                                            int total_rows) {
  const int lane = threadIdx.x & 31;
  const int warps = (gridDim.x * kGemvThreads) >> 5;
  // Launched as a programmatic dependent of the previous kernel: the first
  // weight loads (which do not depend on it) are issued before waiting for
  // it to finish and publish x.
  bool waited = false;
  auto wait_for_x = [&] {
    if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
    waited = true;
  };
  for (int grow = (blockIdx.x * kGemvThreads + threadIdx.x) >> 5; grow < total_rows; grow += warps) {
    int row = grow;
    int i = 0;
    while (i < seg.n && row >= seg.rows[i]) row -= seg.rows[i++];
    const int out = seg.rows[i];
    Out* __restrict__ y = static_cast<Out*>(seg.y[i]);
    const int warp = row;
    const Bf16x8* wr = reinterpret_cast<const Bf16x8*>(seg.w[i] + int64_t(warp) * in);
    const int chunks = in / 8;
    float acc[T] = {};
    int c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
      Bf16x8 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        // Streaming loads: W is read once per step, keep it out of L1.
        const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(wr + c + 32 * u));
        wv[u] = *reinterpret_cast<const Bf16x8*>(&raw);
      }
      wait_for_x();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float wf[8];
        bf16x8_to_f32(wv[u], wf);
#pragma unroll
        for (int t = 0; t < T; ++t) {
          float xf[8];
          bf16x8_to_f32(reinterpret_cast<const Bf16x8*>(x + int64_t(t) * in)[c + 32 * u], xf);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[t] += wf[k] * xf[k];
        }
      }
    }
    wait_for_x();
    for (; c < chunks; c += 32) {
      float wf[8];
      bf16x8_to_f32(wr[c], wf);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xf[8];
        bf16x8_to_f32(reinterpret_cast<const Bf16x8*>(x + int64_t(t) * in)[c], xf);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[t] += wf[k] * xf[k];
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) {
        if constexpr (sizeof(Out) == 4)
          y[int64_t(t) * out + warp] = s;
        else
          y[int64_t(t) * out + warp] = __float2bfloat16(s);
      }
    }
  }
}

template <int T, typename Out>
void launch_as(const Tensor& x, const GemvSegments& seg, int rows, cudaStream_t stream) {
  static int per_sm = 0, sms = 0;  // resident blocks per SM, SM count: read once
  if (per_sm == 0) {
    int dev = 0;
    SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
    SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<T, Out>, kGemvThreads, 0));
    per_sm = std::max(per_sm, 1);
  }
  const int needed = int((int64_t(rows) * 32 + kGemvThreads - 1) / kGemvThreads);
  const int blocks = std::min(needed, per_sm * sms);
  // Programmatic dependent launch: our blocks may start while the previous
  // kernel drains; the kernel waits (griddepcontrol.wait) before reading x.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(kGemvThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  SERVAL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<T, Out>, bf(x), seg, int(x.cols), rows));
}

template <int T>
void launch(const Tensor& x, const GemvSegments& seg, bool f32, cudaStream_t stream) {
  int rows = 0;
  for (int i = 0; i < seg.n; ++i) rows += seg.rows[i];
  if (f32)
    launch_as<T, float>(x, seg, rows, stream);
  else
    launch_as<T, bf16>(x, seg, rows, stream);
}

}  // namespace

bool gemv_fits(const Tensor& x) { return x.rows >= 1 && x.rows <= 8 && x.cols % 8 == 0; }

// ys[i] = x @ ws[i]^T; the outputs are all bf16, or a single f32 one.
void gemv(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n, cudaStream_t stream) {
  SERVAL_CHECK(n >= 1 && n <= 3, "gemv: ", n, " weights in one launch (1..3)");
  GemvSegments seg{};
  seg.n = n;
  for (int i = 0; i < n; ++i) {
    seg.w[i] = ws[i];
    seg.y[i] = ys[i].data;
    seg.rows[i] = int(ys[i].cols);
  }
  const bool f32 = ys[0].dtype == DType::F32;
  switch (x.rows) {
    case 1: launch<1>(x, seg, f32, stream); break;
    case 2: launch<2>(x, seg, f32, stream); break;
    case 3: launch<3>(x, seg, f32, stream); break;
    case 4: launch<4>(x, seg, f32, stream); break;
    case 5: launch<5>(x, seg, f32, stream); break;
    case 6: launch<6>(x, seg, f32, stream); break;
    case 7: launch<7>(x, seg, f32, stream); break;
    case 8: launch<8>(x, seg, f32, stream); break;
    default: fail("gemv: ", x.rows, " rows is outside 1..8");
  }
}

}  // namespace serval::cuda
