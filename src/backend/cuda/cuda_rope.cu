// Rotary position embedding, in place on q and k. The angle is float(pos) *
// inv_freq in f32, as torch (and the CPU backend) compute it.
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

namespace {

// One block per token; thread i handles pair i of some head of q or k.
__global__ void rope_kernel(bf16* q, bf16* k, const int32_t* positions, const float* inv_freq, int q_heads,
                            int k_heads, int head_dim, int rope_dim, bool neox) {
  const int t = blockIdx.x;
  const int half = rope_dim / 2;
  const float pos = float(positions[t]);
  const int pairs = (q_heads + k_heads) * half;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    const int head = e / half, i = e % half;
    bf16* v = head < q_heads ? q + (int64_t(t) * q_heads + head) * head_dim
                             : k + (int64_t(t) * k_heads + head - q_heads) * head_dim;
    const float angle = pos * inv_freq[i];
    // Full-precision sincosf (not the __sinf intrinsics): within an ulp or two
    // of the CPU's double-then-round, far below bf16's resolution, and much
    // faster than double sincos.
    float sn, cs;
    sincosf(angle, &sn, &cs);
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = __bfloat162float(v[ia]), b = __bfloat162float(v[ib]);
    v[ia] = __float2bfloat16(a * cs - b * sn);
    v[ib] = __float2bfloat16(b * cs + a * sn);
  }
}

}  // namespace

void CudaBackend::rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& p) {
  SERVAL_CHECK(q.dtype == DType::BF16 && k.dtype == DType::BF16, "rope: expects bf16 q and k");
  SERVAL_CHECK(p.head_dim > 0 && p.rope_dim > 0 && p.rope_dim <= p.head_dim && p.rope_dim % 2 == 0 &&
                   q.cols % p.head_dim == 0 && k.cols % p.head_dim == 0,
               "rope: head_dim ", p.head_dim, " / rope_dim ", p.rope_dim, " do not fit q width ", q.cols,
               " and k width ", k.cols);
  if (q.rows == 0) return;
  const int q_heads = int(q.cols / p.head_dim), k_heads = int(k.cols / p.head_dim);
  const int pairs = (q_heads + k_heads) * (p.rope_dim / 2);
  const int threads = std::min(512, (pairs + 31) / 32 * 32);
  rope_kernel<<<unsigned(q.rows), threads, 0, stream_>>>(bf(q), bf(k), positions, p.inv_freq, q_heads, k_heads,
                                                         p.head_dim, p.rope_dim, p.style == RopeStyle::Neox);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace serval::cuda
