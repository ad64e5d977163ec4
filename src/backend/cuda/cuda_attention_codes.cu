#include "backend/cuda/cuda_attention_codes.h"

#include <math_constants.h>

#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_kv_elem.cuh"
#include "core/error.h"

namespace serval::cuda {

namespace {

constexpr int kThreads = 256;  // also the keys of one chunk and the largest head_dim

struct CodesParams {
  const uint8_t* k_pool;
  const uint8_t* v_pool;
  const float* scales;  // K's per KV head, then V's
  BatchView b;
  int num_heads, kv_heads, head_dim, block_size;
  int64_t window;
  float scale;
};

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = is_max ? -CUDART_INF_F : 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) r = is_max ? fmaxf(r, red[i]) : r + red[i];
  __syncthreads();
  return r;
}

template <typename T, typename Q>
__global__ void __launch_bounds__(kThreads) attention_codes_kernel(const T* q, T* out, CodesParams p) {
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, D = p.head_dim;
  const int kvh = h / (p.num_heads / p.kv_heads);
  // The sequence of token t: the last s with query_start[s] <= t.
  int lo = 0, hi = p.b.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.b.query_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int32_t* table = p.b.block_table + int64_t(lo) * p.b.max_blocks_per_seq;
  const int64_t end = int64_t(p.b.positions[t]) + 1;
  const int64_t first = p.window > 0 ? max(int64_t(0), end - p.window) : 0;
  const int64_t row = int64_t(p.kv_heads) * D;
  const float ks = p.scales[kvh], vs = p.scales[p.kv_heads + kvh];

  __shared__ float qs[kThreads], ps[kThreads], red[kThreads / 32];
  if (tid < D) qs[tid] = load1(q, (int64_t(t) * p.num_heads + h) * D + tid);
  __syncthreads();
  auto slot_of = [&](int64_t pos) { return int64_t(table[pos / p.block_size]) * p.block_size + pos % p.block_size; };
  auto score = [&](int64_t pos) {
    const uint8_t* k = p.k_pool + slot_of(pos) * row + int64_t(kvh) * D;
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += qs[d] * (kv_decode(Q{}, k[d]) * ks);
    return s * p.scale;
  };
  float mx = -CUDART_INF_F;
  for (int64_t j = first + tid; j < end; j += kThreads) mx = fmaxf(mx, score(j));
  mx = block_reduce(mx, red, true);

  float acc = 0.0f, sum = 0.0f;
  for (int64_t c0 = first; c0 < end; c0 += kThreads) {
    const int64_t j = c0 + tid;
    const float e = j < end ? __expf(score(j) - mx) : 0.0f;
    ps[tid] = e;
    sum += e;
    __syncthreads();
    if (tid < D) {
      const int n = int(min(int64_t(kThreads), end - c0));
      for (int i = 0; i < n; ++i)
        acc += ps[i] * (kv_decode(Q{}, p.v_pool[slot_of(c0 + i) * row + int64_t(kvh) * D + tid]) * vs);
    }
    __syncthreads();
  }
  sum = block_reduce(sum, red, false);
  if (tid < D) store1(out, (int64_t(t) * p.num_heads + h) * D + tid, acc / sum);
}

template <typename T>
void launch(const Tensor& q, Tensor out, const CodesParams& p, bool fp8, int tokens, cudaStream_t stream) {
  const dim3 grid(unsigned(tokens), unsigned(p.num_heads));
  if (fp8)
    attention_codes_kernel<T, KvFp8><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(q.data),
                                                                     static_cast<T*>(out.data), p);
  else
    attention_codes_kernel<T, KvInt8><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(q.data),
                                                                      static_cast<T*>(out.data), p);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void attention_over_codes(const Tensor& q, const KvLayer& kv, const KvGeometry& g, const BatchView& b,
                          int32_t num_heads, float scale, Tensor out, cudaStream_t stream) {
  SERVAL_CHECK(g.head_dim <= kThreads && g.num_kv_heads > 0 && num_heads % g.num_kv_heads == 0,
               "paged_attention over a quantized KV cache: head_dim ", g.head_dim, " (at most ", kThreads,
               "), ", num_heads, " query heads over ", g.num_kv_heads, " KV heads");
  SERVAL_CHECK(q.dtype == out.dtype && (q.dtype == DType::BF16 || q.dtype == DType::F32),
               "paged_attention over a quantized KV cache: q and out of ", dtype_name(q.dtype), " and ",
               dtype_name(out.dtype));
  if (b.num_tokens == 0 || b.num_seqs == 0) return;
  const CodesParams p{static_cast<const uint8_t*>(kv.k.data()), static_cast<const uint8_t*>(kv.v.data()),
                      static_cast<const float*>(kv.scales.data()), b, num_heads, g.num_kv_heads, g.head_dim,
                      g.block_size, g.window, scale};
  const bool fp8 = g.dtype == DType::FP8_E4M3;
  if (q.dtype == DType::F32)
    launch<float>(q, out, p, fp8, b.num_tokens, stream);
  else
    launch<bf16>(q, out, p, fp8, b.num_tokens, stream);
}

}  // namespace serval::cuda
