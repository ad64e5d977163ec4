// Rotary position embedding, in place on q and k, and fused with the KV-cache
// write: rotated k goes straight to its slot, so k is read once and not written
// back. The angle is float(pos) * inv_freq in f32, as torch (and the CPU
// backend) compute it. T is the activation dtype (bf16, or f32 with
// --dtype float32), which is also the KV cache's.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_cutlass_gemm.h"
#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_launches.h"
#include "backend/cuda/cuda_rope.cuh"

namespace serval::cuda {

namespace {

// One block per token; thread i handles pair i of some head of q or k.
template <typename T>
__global__ void rope_kernel(T* q, T* k, const int32_t* positions, const float* inv_freq, int q_heads,
                            int k_heads, int head_dim, int rope_dim, bool neox) {
  const int t = blockIdx.x;
  const int half = rope_dim / 2;
  const float pos = float(positions[t]);
  const int pairs = (q_heads + k_heads) * half;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    const int head = e / half, i = e % half;
    T* v = head < q_heads ? q + (int64_t(t) * q_heads + head) * head_dim
                          : k + (int64_t(t) * k_heads + head - q_heads) * head_dim;
    const float angle = pos * inv_freq[i];
    // Full-precision sincosf (not the __sinf intrinsics): within an ulp or two
    // of the CPU's double-then-round, far below bf16's resolution, and much
    // faster than double sincos.
    float sn, cs;
    sincosf(angle, &sn, &cs);
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    float a = load1(v, ia), b = load1(v, ib);
    rope_rotate(a, b, cs, sn, a, b);
    store1(v, ia, a);
    store1(v, ib, b);
  }
}

// Where the kernel reads each token's q, k and v: three tensors (q rotated in
// place), or one stacked q/k/v product row per token.
template <typename T>
struct RopeKvInput {
  const T* q;
  const T* k;
  const T* v;
  int64_t q_stride, kv_stride;  // elements from one token's row to the next
};

// Grid (token, group of kHeadsPerBlock heads): q pairs rotated into q_out
// ([T, q_heads * head_dim]; it may be in.q); k pairs rotated into the token's
// slot of the K pool (dimensions past rope_dim copied); v copied to the V
// pool, each block taking a share of the row. The pools' rows are
// [kv_heads * head_dim]. cos/sin of the
// token's rope_dim / 2 angles are computed once per block, not once per head:
// a decode step has one token, and sincosf per element made this kernel
// latency-bound.
constexpr int kHeadsPerBlock = 8;
// Threads per block, kBatch pairs each: a block of 8 heads x 64 pairs is 128
// threads, which leaves room on each SM for the decode attention kernel
// launched after it (3 blocks of 128 threads); at 512 threads per block this
// kernel alone filled the SMs' threads.
constexpr int kBatch = 4, kMaxThreads = 128;

template <typename T>
__global__ void rope_kv_write_kernel(RopeKvInput<T> in, T* q_out, const int32_t* positions, const int64_t* slots,
                                     const float* inv_freq, KvPoolLayout<T> kv, int q_heads, int rope_dim,
                                     bool neox) {
  extern __shared__ float cs_s[];  // [half] cos, then [half] sin
  const int t = blockIdx.x;
  const int half = rope_dim / 2;
  // Positions, slots and frequencies are not written by the previous kernel
  // (the q/k/v projection): they are loaded while it drains (launch_pdl).
  const float pos = float(positions[t]);
  const int64_t slot = slots[t];
  const float freq0 = int(threadIdx.x) < half ? inv_freq[threadIdx.x] : 0.0f;
  pdl_wait();
  pdl_launch_dependents();
  const int k_heads = kv.kv_heads, head_dim = kv.head_dim;
  const int64_t kv_row = kv.row();
  const T* kt = in.k + int64_t(t) * in.kv_stride;
  T* Kt = kv.at(false, slot);
  const int head0 = blockIdx.y * kHeadsPerBlock;
  const int heads = min(kHeadsPerBlock, q_heads + k_heads - head0);
  // A thread's pairs go kBatch at a time, every load before the first store
  // (q_out may be the input, so the compiler would not move them itself).
  // Pair e: head head0 + e / half (q's, then k's), frequency i, elements ia, ib.
  struct Pair {
    int head, i, ia, ib;
  };
  auto pair = [&](int e) {
    const int head = head0 + e / half, i = e % half;
    return Pair{head, i, neox ? i : 2 * i, neox ? i + half : 2 * i + 1};
  };
  const int n_pairs = heads * half;
  float a[kBatch], b[kBatch];
  auto load_batch = [&](int e0) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (e0 + u * int(blockDim.x) >= n_pairs) continue;
      const Pair r = pair(e0 + u * int(blockDim.x));
      const T* h = r.head < q_heads ? in.q + int64_t(t) * in.q_stride + int64_t(r.head) * head_dim
                                    : kt + int64_t(r.head - q_heads) * head_dim;
      a[u] = load1(h, r.ia);
      b[u] = load1(h, r.ib);
    }
  };
  // The first batch's loads fly while the block works out the angles: after
  // a kernel that does not launch us early (cuBLASLt's), the position and
  // these loads are one round trip instead of two.
  load_batch(int(threadIdx.x));
  if (int(threadIdx.x) < half) sincosf(pos * freq0, &cs_s[half + threadIdx.x], &cs_s[threadIdx.x]);
  for (int i = threadIdx.x + blockDim.x; i < half; i += blockDim.x)  // more pairs than threads
    sincosf(pos * inv_freq[i], &cs_s[half + i], &cs_s[i]);
  __syncthreads();
  for (int e0 = threadIdx.x; e0 < n_pairs; e0 += kBatch * blockDim.x) {
    if (e0 != int(threadIdx.x)) load_batch(e0);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (e0 + u * int(blockDim.x) >= n_pairs) continue;
      const Pair r = pair(e0 + u * int(blockDim.x));
      T* o = r.head < q_heads ? q_out + (int64_t(t) * q_heads + r.head) * head_dim
                              : Kt + int64_t(r.head - q_heads) * head_dim;
      float ra, rb;
      rope_rotate(a[u], b[u], cs_s[r.i], cs_s[half + r.i], ra, rb);
      store1(o, r.ia, ra);
      store1(o, r.ib, rb);
    }
  }
  const int pass = head_dim - rope_dim;  // partial rotary: the rest of each k head
  for (int e = threadIdx.x; e < heads * pass; e += blockDim.x) {
    const int head = head0 + e / pass;
    if (head < q_heads) {  // q's pass-through dims: copied unless q is rotated in place
      if (in.q != q_out) {
        const int64_t d = int64_t(head) * head_dim + rope_dim + e % pass;
        q_out[int64_t(t) * q_heads * head_dim + d] = in.q[int64_t(t) * in.q_stride + d];
      }
      continue;
    }
    const int64_t off = int64_t(head - q_heads) * head_dim + rope_dim + e % pass;
    Kt[off] = kt[off];
  }
  // This block's share of the v row.
  const T* vt = in.v + int64_t(t) * in.kv_stride;
  T* Vt = kv.at(true, slot);
  if (kv_row % 8 == 0 && in.kv_stride % 8 == 0 && reinterpret_cast<uintptr_t>(in.v) % 16 == 0) {
    const int64_t n8 = kv_row / 8, per = (n8 + gridDim.y - 1) / gridDim.y;
    const int64_t c1 = min(n8, per * (blockIdx.y + 1));
    for (int64_t c = per * blockIdx.y + threadIdx.x; c < c1; c += blockDim.x)
      reinterpret_cast<Vec8<T>*>(Vt)[c] = reinterpret_cast<const Vec8<T>*>(vt)[c];
  } else {
    const int64_t per = (kv_row + gridDim.y - 1) / gridDim.y, c1 = min(kv_row, per * (blockIdx.y + 1));
    for (int64_t c = per * blockIdx.y + threadIdx.x; c < c1; c += blockDim.x) Vt[c] = vt[c];
  }
}

// One block per token: (cos, sin) of positions[t] * inv_freq[i], as the rope
// kernels compute them.
__global__ void rope_angles_kernel(const int32_t* positions, const float* inv_freq, int half, float2* angles) {
  const float pos = float(positions[blockIdx.x]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float sn, cs;
    sincosf(pos * inv_freq[i], &sn, &cs);
    angles[int64_t(blockIdx.x) * half + i] = make_float2(cs, sn);
  }
}

// q_out: where rotated q goes ([T, q_heads * head_dim]); `in` may point into it.
template <typename T>
void launch_rope_kv_write(const RopeKvInput<T>& in, const Tensor& q_out, const int32_t* positions, const RopeParams& p,
                          const int64_t* slot_mapping, const KvPoolLayout<T>& kv, const Launch& on) {
  const int q_heads = int(q_out.cols / p.head_dim), k_heads = kv.kv_heads;
  const int pairs = kHeadsPerBlock * (p.rope_dim / 2);
  const int threads = std::min(kMaxThreads, (ceil_div(pairs, kBatch) + 31) / 32 * 32);
  const dim3 grid(unsigned(q_out.rows), unsigned(ceil_div(q_heads + k_heads, kHeadsPerBlock)));
  const size_t smem = size_t(p.rope_dim) * sizeof(float);
  launch_pdl(rope_kv_write_kernel<T>, grid, dim3(unsigned(threads)), smem, on, in, static_cast<T*>(q_out.data),
             positions, slot_mapping, p.inv_freq, kv, q_heads, p.rope_dim, p.style == RopeStyle::Neox);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void check_rope(const Tensor& q, const Tensor& k, const RopeParams& p, DType act) {
  SERVAL_CHECK(q.dtype == act && k.dtype == act, "rope: expects ", dtype_name(act), " q and k");
  SERVAL_CHECK(p.head_dim > 0 && p.rope_dim > 0 && p.rope_dim <= p.head_dim && p.rope_dim % 2 == 0 &&
                   q.cols % p.head_dim == 0 && k.cols % p.head_dim == 0,
               "rope: head_dim ", p.head_dim, " / rope_dim ", p.rope_dim, " do not fit q width ", q.cols,
               " and k width ", k.cols);
}

}  // namespace

void CudaBackend::rope_kv_write(Tensor q, Tensor k, const Tensor& v, const int32_t* positions, const RopeParams& p,
                                const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& g) {
  const DType act = cfg_.act_dtype;
  check_rope(q, k, p, act);
  const int64_t row = int64_t(g.num_kv_heads) * g.head_dim;
  SERVAL_CHECK(v.dtype == act && k.cols == row && v.cols == row && g.head_dim == p.head_dim,
               "rope_kv_write: k and v must be ", dtype_name(act), " of width ", row, ", got ", k.cols, " and ",
               v.cols);
  if (q.rows == 0) return;
  dev_.bind();
  if (kv_dtype_quantized(g.dtype)) return Backend::rope_kv_write(q, k, v, positions, p, slot_mapping, kv, g);
  const Launch on = launch_on(dev_, cfg_);
  if (act == DType::F32)
    launch_rope_kv_write<float>({static_cast<const float*>(q.data), static_cast<const float*>(k.data),
                                 static_cast<const float*>(v.data), q.cols, k.cols},
                                q, positions, p, slot_mapping, kv_layout<float>(kv, g), on);
  else
    launch_rope_kv_write<bf16>(
        {bf(q), static_cast<const bf16*>(k.data), static_cast<const bf16*>(v.data), q.cols, k.cols}, q, positions, p,
        slot_mapping, kv_layout<bf16>(kv, g), on);
}

void rope_kv_write_from_stacked(const void* qkv, int64_t row, int64_t k_col, int64_t v_col, Tensor q,
                                int64_t kv_cols, const int32_t* positions, const RopeParams& p,
                                const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& g, const Launch& on) {
  check_rope(q, q, p, DType::BF16);
  SERVAL_CHECK(kv_cols == int64_t(g.num_kv_heads) * g.head_dim &&
                   g.head_dim == p.head_dim && k_col >= q.cols && v_col >= k_col + kv_cols && row >= v_col + kv_cols,
               "rope_kv_write_from_stacked: q [", q.rows, ", ", q.cols, "], k at ", k_col, ", v at ", v_col,
               " do not fit a stacked row of ", row);
  if (q.rows == 0) return;
  const bf16* base = static_cast<const bf16*>(qkv);
  launch_rope_kv_write<bf16>({base, base + k_col, base + v_col, row, row}, q, positions, p, slot_mapping,
                             kv_layout<bf16>(kv, g), on);
}

void launch_rope_angles(const int32_t* positions, const float* inv_freq, int64_t tokens, int half, float2* angles,
                        cudaStream_t stream) {
  rope_angles_kernel<<<unsigned(tokens), std::min(256, (half + 31) / 32 * 32), 0, stream>>>(positions, inv_freq, half,
                                                                                           angles);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& p) {
  check_rope(q, k, p, cfg_.act_dtype);
  if (q.rows == 0) return;
  dev_.bind();
  const int q_heads = int(q.cols / p.head_dim), k_heads = int(k.cols / p.head_dim);
  const int pairs = (q_heads + k_heads) * (p.rope_dim / 2);
  const int threads = std::min(512, (pairs + 31) / 32 * 32);
  const bool neox = p.style == RopeStyle::Neox;
  if (cfg_.act_dtype == DType::F32)
    rope_kernel<float><<<unsigned(q.rows), threads, 0, dev_.stream()>>>(static_cast<float*>(q.data),
                                                                  static_cast<float*>(k.data), positions, p.inv_freq,
                                                                  q_heads, k_heads, p.head_dim, p.rope_dim, neox);
  else
    rope_kernel<bf16><<<unsigned(q.rows), threads, 0, dev_.stream()>>>(bf(q), bf(k), positions, p.inv_freq, q_heads,
                                                                 k_heads, p.head_dim, p.rope_dim, neox);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace serval::cuda
