// Split-KV ("FlashDecoding") attention for sequences with one new token.
// One thread block serves one (sequence, KV head, split): the whole GQA group
// of query heads shares each K/V tile it loads, so K/V is read from memory
// once per group. Splits over the context keep all SMs busy when the batch is
// small; a second kernel merges the splits' partial softmaxes.
#include <math_constants.h>

#include "backend/cuda/cuda_attention.cuh"

namespace serval::cuda {

namespace {

constexpr int kDecodeThreads = 128;
constexpr int kMaxSplits = 128;

__host__ __device__ constexpr int round4(int n) { return (n + 3) / 4 * 4; }

// Shared memory: q [G, D] f32, acc [G, D] f32, p [G, BK] f32, (m, l, alpha)
// per head, then K tile [BK, D + 8] and V tile [BK, D] in bf16. The 8-element
// pad on K rows keeps lanes that read different keys in different banks.
template <int D>
__global__ void __launch_bounds__(kDecodeThreads) attn_decode_kernel(AttnParams p) {
  constexpr int BK = kDecodeKeyTile, NCH = D / 8, KS = D + 8, PER_LANE = BK / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = p.group;
  float* q_s = reinterpret_cast<float*>(smem);
  float* acc_s = q_s + G * D;
  float* p_s = acc_s + G * D;
  float* ml_s = p_s + G * BK;
  bf16* k_s = reinterpret_cast<bf16*>(ml_s + round4(3 * G));
  bf16* v_s = k_s + BK * KS;

  const int s = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x, tid = threadIdx.x;
  const int q0 = p.query_start[s];
  if (p.query_start[s + 1] - q0 != 1) return;  // the prefill kernel serves it
  const int n_ctx = p.positions[q0] + 1;
  const int n_tiles = (n_ctx + BK - 1) / BK;
  const int tile0 = split * p.tiles_per_split, tile1 = min(n_tiles, tile0 + p.tiles_per_split);
  const int32_t* table = p.block_table + int64_t(s) * p.max_blocks_per_seq;
  const bf16* qrow = p.q + int64_t(q0) * p.num_heads * D + int64_t(kvh) * G * D;

  for (int i = tid; i < G * D; i += kDecodeThreads) {
    q_s[i] = __bfloat162float(qrow[i]) * p.scale_log2;
    acc_s[i] = 0.0f;
  }
  for (int h = tid; h < G; h += kDecodeThreads) {
    ml_s[3 * h] = -CUDART_INF_F;
    ml_s[3 * h + 1] = 0.0f;
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  for (int tile = tile0; tile < tile1; ++tile) {
    const int key0 = tile * BK;
    // Consecutive threads read consecutive 16-byte chunks of one key row. All
    // loads of a thread are issued before its first store, so a tile costs
    // one memory round trip rather than one per chunk.
    constexpr int kLoads = (BK * NCH + kDecodeThreads - 1) / kDecodeThreads;
    Bf16x8 kv[kLoads], vv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = tid + u * kDecodeThreads, key = c / NCH, ch = c % NCH, j = key0 + key;
      kv[u] = vv[u] = Bf16x8{};
      if (c < BK * NCH && j < n_ctx) {
        kv[u] = reinterpret_cast<const Bf16x8*>(kv_row(p.k_pool, p, table, j, kvh))[ch];
        vv[u] = reinterpret_cast<const Bf16x8*>(kv_row(p.v_pool, p, table, j, kvh))[ch];
      }
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = tid + u * kDecodeThreads, key = c / NCH, ch = c % NCH;
      if (c < BK * NCH) {
        *reinterpret_cast<Bf16x8*>(k_s + key * KS + ch * 8) = kv[u];
        *reinterpret_cast<Bf16x8*>(v_s + key * D + ch * 8) = vv[u];
      }
    }
    __syncthreads();

    // Scores. With few heads per group (G * BK < threads), `split` neighbouring
    // lanes share one key's dot product, each taking every split-th chunk of
    // head_dim, so that all threads work. Keys past the context are skipped.
    const int split = max(1, min(kDecodeThreads / (G * BK), NCH));  // 1, 2 or 4
    const int live = min(BK, n_ctx - key0);
    for (int e = tid; e < G * BK * split; e += kDecodeThreads) {
      const int part = e % split, he = e / split, h = he / BK, key = he % BK;
      float dot = 0.0f;
      if (key < live) {
        const float* qh = q_s + h * D;
        const bf16* kr = k_s + key * KS;
#pragma unroll 4
        for (int ch = part; ch < NCH; ch += split) {
          float kf[8];
          bf16x8_to_f32(*reinterpret_cast<const Bf16x8*>(kr + ch * 8), kf);
          const float4 a = *reinterpret_cast<const float4*>(qh + ch * 8);
          const float4 b = *reinterpret_cast<const float4*>(qh + ch * 8 + 4);
          dot += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + b.x * kf[4] + b.y * kf[5] + b.z * kf[6] +
                 b.w * kf[7];
        }
      }
      // Partners are adjacent lanes of full warps (G * BK * split is a multiple of 32).
      for (int o = 1; o < split; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (part == 0) p_s[he] = key < live ? dot : -CUDART_INF_F;
    }
    __syncthreads();

    // Online softmax, one warp per head: the tile has at least one live key.
    for (int h = warp; h < G; h += kDecodeThreads / 32) {
      float* ph = p_s + h * BK;
      float sc[PER_LANE], mx = -CUDART_INF_F;
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i) mx = fmaxf(mx, sc[i] = ph[lane + 32 * i]);
      const float m_old = ml_s[3 * h];
      const float m_new = fmaxf(m_old, warp_max(mx));
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i) {
        sc[i] = exp2f(sc[i] - m_new);
        sum += sc[i];
        ph[lane + 32 * i] = sc[i];
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);
        ml_s[3 * h] = m_new;
        ml_s[3 * h + 1] = ml_s[3 * h + 1] * alpha + sum;
        ml_s[3 * h + 2] = alpha;
      }
    }
    __syncthreads();

    for (int e = tid; e < G * D / 2; e += kDecodeThreads) {
      const int h = e / (D / 2), d = 2 * (e % (D / 2));
      float2 a = *reinterpret_cast<float2*>(acc_s + h * D + d);
      const float alpha = ml_s[3 * h + 2];
      a.x *= alpha;
      a.y *= alpha;
      const float* ph = p_s + h * BK;
#pragma unroll 8
      for (int key = 0; key < live; ++key) {
        const float pk = ph[key];
        const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_s + key * D + d));
        a.x += pk * v.x;
        a.y += pk * v.y;
      }
      *reinterpret_cast<float2*>(acc_s + h * D + d) = a;
    }
    __syncthreads();
  }

  if (p.num_splits == 1) {
    bf16* orow = p.out + int64_t(q0) * p.num_heads * D + int64_t(kvh) * G * D;
    for (int e = tid; e < G * D; e += kDecodeThreads) orow[e] = __float2bfloat16(acc_s[e] / ml_s[3 * (e / D) + 1]);
  } else {
    const int64_t base = (int64_t(s) * p.kv_heads + kvh) * p.num_splits + split;
    for (int e = tid; e < G * D; e += kDecodeThreads) p.part_out[base * G * D + e] = acc_s[e];
    for (int h = tid; h < G; h += kDecodeThreads) {
      p.part_ml[(base * G + h) * 2] = ml_s[3 * h];
      p.part_ml[(base * G + h) * 2 + 1] = ml_s[3 * h + 1];
    }
  }
}

// Merges the splits of one (sequence, query head): out = sum_i w_i o_i / sum_i w_i l_i
// with w_i = 2^(m_i - max m). Empty splits have m = -inf and weigh nothing.
__global__ void attn_combine_kernel(AttnParams p) {
  __shared__ float w_s[kMaxSplits];
  __shared__ float inv_l;
  const int s = blockIdx.y, head = blockIdx.x;
  const int q0 = p.query_start[s];
  if (p.query_start[s + 1] - q0 != 1) return;
  const int G = p.group, kvh = head / G, h = head % G, D = p.head_dim;
  const int64_t base = (int64_t(s) * p.kv_heads + kvh) * p.num_splits;
  if (threadIdx.x == 0) {
    float M = -CUDART_INF_F;
    for (int i = 0; i < p.num_splits; ++i) M = fmaxf(M, p.part_ml[((base + i) * G + h) * 2]);
    float L = 0.0f;
    for (int i = 0; i < p.num_splits; ++i) {
      const float m = p.part_ml[((base + i) * G + h) * 2];
      const float w = m == -CUDART_INF_F ? 0.0f : exp2f(m - M);
      w_s[i] = w;
      L += w * p.part_ml[((base + i) * G + h) * 2 + 1];
    }
    inv_l = 1.0f / L;
  }
  __syncthreads();
  bf16* orow = p.out + int64_t(q0) * p.num_heads * D + int64_t(head) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < p.num_splits; ++i)
      if (w_s[i] != 0.0f) acc += w_s[i] * p.part_out[((base + i) * G + h) * D + d];
    orow[d] = __float2bfloat16(acc * inv_l);
  }
}

template <int D>
void launch_decode(const AttnParams& p, cudaStream_t stream) {
  const size_t smem = attention_decode_smem(p.group, D);
  if (smem > 48 * 1024)
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(smem)));
  const dim3 grid(unsigned(p.num_splits), unsigned(p.kv_heads), unsigned(p.num_seqs));
  attn_decode_kernel<D><<<grid, kDecodeThreads, smem, stream>>>(p);
  SERVAL_CUDA_LAUNCH_CHECK();
  if (p.num_splits > 1) {
    attn_combine_kernel<<<dim3(unsigned(p.num_heads), unsigned(p.num_seqs)), std::min(D, 128), 0, stream>>>(p);
    SERVAL_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

size_t attention_decode_smem(int group, int head_dim) {
  const int floats = 2 * group * head_dim + group * kDecodeKeyTile + round4(3 * group);
  return size_t(floats) * 4 + size_t(kDecodeKeyTile) * (2 * head_dim + 8) * 2;
}

int attention_max_splits() { return kMaxSplits; }

bool launch_attention_decode(const AttnParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 8: launch_decode<8>(p, stream); return true;
    case 16: launch_decode<16>(p, stream); return true;
    case 32: launch_decode<32>(p, stream); return true;
    case 64: launch_decode<64>(p, stream); return true;
    case 80: launch_decode<80>(p, stream); return true;
    case 96: launch_decode<96>(p, stream); return true;
    case 128: launch_decode<128>(p, stream); return true;
    case 256: launch_decode<256>(p, stream); return true;
    default: return false;
  }
}

}  // namespace serval::cuda
