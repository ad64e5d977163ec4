// CUDA-core fallback of the prefill attention, for head dims without a
// tensor-core kernel (cuda_attention_prefill.cu serves 64 and 128): online
// softmax over key tiles read through the block table, causal by position, so
// a chunk attends to the cached prefix and to itself. A thread block takes 64
// query rows of one KV head (64 / G tokens x the G query heads of its GQA
// group) so K/V tiles are shared by the group. f32 math.
//
// The kernel is templated on the element type of q, out and the pools: bf16,
// or f32 with --dtype float32. In f32 mode it is the only attention kernel
// (the tensor-core ones are bf16), so it also serves decode rows: a sequence
// with one new token is a tile of G live rows (so in batch-invariant mode).
// With a sliding window (kWindow) the keys start at the tile holding the
// block's first row's first key; keys below a row's window are masked, and
// keys below the block's first key are never looked up (released blocks).
#include <math_constants.h>


#include "backend/cuda/cuda_attention_prefill_simt.cuh"
#include "backend/cuda/cuda_elem.cuh"

namespace serval::cuda {

namespace {

constexpr int kRows = 64;  // query rows per block
constexpr int kThreads = 128;
constexpr int kKeyTile = 64;

// Address of key/value j of sequence s (block table `table`), KV head kvh.
template <typename T>
__device__ __forceinline__ const T* paged_row(const T* pool, const AttnParamsT<T>& p, const int32_t* table, int j,
                                              int kvh) {
  const int64_t slot = int64_t(table[j / p.block_size]) * p.block_size + j % p.block_size;
  return pool + kv_offset(slot, kvh, p.kv_heads, p.head_dim);
}

template <typename T, int D>
constexpr size_t prefill_smem() {
  // qT [D][64] f32, pT [64][64] f32, kT [D][64] T, V [64][D + 8] T
  return size_t(D) * kRows * 4 + size_t(kKeyTile) * kRows * 4 + size_t(D) * kKeyTile * sizeof(T) +
         size_t(kKeyTile) * (D + 8) * sizeof(T);
}

// Thread (ty, tx) = (tid / 8, tid % 8) owns query rows 4ty..4ty+3; for scores
// it owns keys 8tx..8tx+7 of the tile, for the output the 8-wide chunks
// tx, tx + 8, ... of head_dim (so 8 neighbouring lanes read 128 contiguous bytes).
template <typename T, int D, bool kWindow>
__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(AttnParamsT<T> p) {
  using V8 = Vec8<T>;
  constexpr int BK = kKeyTile, NCH = D / 8, CPT = (NCH + 7) / 8, VS = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  float* qT = reinterpret_cast<float*>(smem);
  float* pT = qT + D * kRows;
  T* kT = reinterpret_cast<T*>(pT + BK * kRows);
  T* vS = kT + D * BK;

  const int G = p.group, QT = kRows / G;
  const int s = blockIdx.z, kvh = blockIdx.y;
  const int qs = p.query_start[s], qe = p.query_start[s + 1];
  if (qe - qs < p.min_query_len) return;  // a decode row, which the decode kernel serves
  const int t0 = qs + blockIdx.x * QT;
  if (t0 >= qe) return;
  const int t_last = min(t0 + QT, qe) - 1;
  const int n_keys = p.positions[t_last] + 1;  // positions increase within a chunk
  // With a window: the first row's first key, and the first tile's.
  const int key_lo = kWindow ? max(0, p.positions[t0] + 1 - p.window) : 0;
  const int key_begin = kWindow ? key_lo / kKeyTile * kKeyTile : 0;
  const int32_t* table = p.block_table + int64_t(s) * p.max_blocks_per_seq;
  const int tid = threadIdx.x, ty = tid >> 3, tx = tid & 7;

  // Query rows r = i * G + h (token t0 + i, head kvh * G + h), pre-scaled.
  for (int e = tid; e < kRows * NCH; e += kThreads) {
    const int r = e % kRows, ch = e / kRows, t = t0 + r / G;
    float f[8] = {};
    if (r < QT * G && t <= t_last) {
      const T* src = p.q + int64_t(t) * p.num_heads * D + int64_t(kvh * G + r % G) * D + ch * 8;
      load8(src, 0, f);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) qT[(ch * 8 + i) * kRows + r] = f[i] * p.scale_log2;
  }
  int pos[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty * 4 + i, t = t0 + r / G;
    pos[i] = (r < QT * G && t <= t_last) ? p.positions[t] : -1;  // -1: padding row, sees no key
  }

  float m[4], l[4], acc[4][CPT * 8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -CUDART_INF_F;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT * 8; ++c) acc[i][c] = 0.0f;
  }

  for (int key0 = key_begin; key0 < n_keys; key0 += BK) {
    __syncthreads();  // the previous tile's K, V and P are consumed
    // All of a thread's K and V loads (bf16), or batches of 4 of them (f32:
    // twice the registers per load), are in flight before their first store.
    constexpr int kLoads = (BK * NCH + kThreads - 1) / kThreads;
    constexpr int kBatch = sizeof(T) == 2 || kLoads < 4 ? kLoads : 4;
#pragma unroll
    for (int u0 = 0; u0 < kLoads; u0 += kBatch) {
      V8 kr[kBatch], vr[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = tid + (u0 + b) * kThreads;  // >= BK * NCH past the last load
        kr[b] = vr[b] = V8{};
        if (c < BK * NCH) {
          const int kkey = c % BK, kch = c / BK, vkey = c / NCH, vch = c % NCH;
          if (key0 + kkey < n_keys && (!kWindow || key0 + kkey >= key_lo))
            kr[b] = reinterpret_cast<const V8*>(paged_row(p.k_pool, p, table, key0 + kkey, kvh))[kch];
          if (key0 + vkey < n_keys && (!kWindow || key0 + vkey >= key_lo))
            vr[b] = reinterpret_cast<const V8*>(paged_row(p.v_pool, p, table, key0 + vkey, kvh))[vch];
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = tid + (u0 + b) * kThreads;
        if (c < BK * NCH) {
          const int kkey = c % BK, kch = c / BK, vkey = c / NCH, vch = c % NCH;
          const T* kb = reinterpret_cast<const T*>(&kr[b]);
#pragma unroll
          for (int i = 0; i < 8; ++i) kT[(kch * 8 + i) * BK + kkey] = kb[i];
          *reinterpret_cast<V8*>(vS + vkey * VS + vch * 8) = vr[b];
        }
      }
    }
    __syncthreads();

    float sc[4][8] = {};
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      const float4 q4 = *reinterpret_cast<const float4*>(qT + d * kRows + ty * 4);
      float kf[8];
      vec8_to_f32(*reinterpret_cast<const V8*>(kT + d * BK + tx * 8), kf);
      const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) sc[i][jj] += qv[i] * kf[jj];
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        if (key0 + tx * 8 + jj > pos[i] || (kWindow && key0 + tx * 8 + jj <= pos[i] - p.window))
          sc[i][jj] = -CUDART_INF_F;
        mx = fmaxf(mx, sc[i][jj]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -CUDART_INF_F ? 0.0f : m_new;  // a row with no live key yet
      const float alpha = exp2f(m[i] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        sc[i][jj] = exp2f(sc[i][jj] - m_use);
        sum += sc[i][jj];
      }
      l[i] = l[i] * alpha + sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < CPT * 8; ++c) acc[i][c] *= alpha;
    }
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
      *reinterpret_cast<float4*>(pT + (tx * 8 + jj) * kRows + ty * 4) =
          make_float4(sc[0][jj], sc[1][jj], sc[2][jj], sc[3][jj]);
    __syncthreads();

#pragma unroll 4
    for (int key = 0; key < BK; ++key) {
      const float4 p4 = *reinterpret_cast<const float4*>(pT + key * kRows + ty * 4);
      const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
      for (int cc = 0; cc < CPT; ++cc) {
        const int c = tx + 8 * cc;
        if (c < NCH) {
          float vf[8];
          vec8_to_f32(*reinterpret_cast<const V8*>(vS + key * VS + c * 8), vf);
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) acc[i][cc * 8 + jj] += pv[i] * vf[jj];
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    li += __shfl_xor_sync(0xffffffffu, li, 4);
    if (pos[i] < 0) continue;
    const int r = ty * 4 + i, t = t0 + r / G;
    T* dst = p.out + int64_t(t) * p.num_heads * D + int64_t(kvh * G + r % G) * D;
    const float inv = 1.0f / li;
#pragma unroll
    for (int cc = 0; cc < CPT; ++cc) {
      const int c = tx + 8 * cc;
      if (c < NCH) {
        float o[8];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) o[jj] = acc[i][cc * 8 + jj] * inv;
        *reinterpret_cast<V8*>(dst + c * 8) = f32_to_vec8<T>(o);
      }
    }
  }
}

template <typename T, int D, bool kWindow>
void launch_window(const AttnParamsT<T>& p, int max_query_len, cudaStream_t stream) {
  constexpr size_t smem = prefill_smem<T, D>();
  static PerDevice<bool> configured;  // the attribute is per kernel and device, set once
  if (smem > 48 * 1024) {
    int dev = 0;
    SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
    configured.get(dev, [] {
      SERVAL_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<T, D, kWindow>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      return true;
    });
  }
  const int qt = kRows / p.group;
  const dim3 grid(unsigned((max_query_len + qt - 1) / qt), unsigned(p.kv_heads), unsigned(p.num_seqs));
  attn_prefill_kernel<T, D, kWindow><<<grid, kThreads, smem, stream>>>(p);
  SERVAL_CUDA_LAUNCH_CHECK();
}

template <typename T, int D>
void launch_prefill(const AttnParamsT<T>& p, int max_query_len, cudaStream_t stream) {
  if (p.window > 0)
    launch_window<T, D, true>(p, max_query_len, stream);
  else
    launch_window<T, D, false>(p, max_query_len, stream);
}

void check_group(int group) {
  SERVAL_CHECK(group >= 1 && group <= kRows, "cuda attention: GQA group of ", group,
               " query heads per KV head is more than the prefill kernel's ", kRows, " rows");
}

}  // namespace

bool launch_attention_prefill_simt(const AttnParams& p, int max_query_len, cudaStream_t stream) {
  check_group(p.group);
  switch (p.head_dim) {
    case 8: launch_prefill<bf16, 8>(p, max_query_len, stream); return true;
    case 16: launch_prefill<bf16, 16>(p, max_query_len, stream); return true;
    case 32: launch_prefill<bf16, 32>(p, max_query_len, stream); return true;
    case 80: launch_prefill<bf16, 80>(p, max_query_len, stream); return true;
    case 96: launch_prefill<bf16, 96>(p, max_query_len, stream); return true;
    case 256: launch_prefill<bf16, 256>(p, max_query_len, stream); return true;
    default: return false;
  }
}

bool launch_attention_f32(const AttnParamsT<float>& p, int max_query_len, cudaStream_t stream) {
  check_group(p.group);
  switch (p.head_dim) {
    case 8: launch_prefill<float, 8>(p, max_query_len, stream); return true;
    case 16: launch_prefill<float, 16>(p, max_query_len, stream); return true;
    case 32: launch_prefill<float, 32>(p, max_query_len, stream); return true;
    case 64: launch_prefill<float, 64>(p, max_query_len, stream); return true;
    case 80: launch_prefill<float, 80>(p, max_query_len, stream); return true;
    case 96: launch_prefill<float, 96>(p, max_query_len, stream); return true;
    case 128: launch_prefill<float, 128>(p, max_query_len, stream); return true;
    case 256: launch_prefill<float, 256>(p, max_query_len, stream); return true;
    default: return false;
  }
}

}  // namespace serval::cuda
