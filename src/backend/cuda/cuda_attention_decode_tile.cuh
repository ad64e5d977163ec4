#pragma once
// What the two decode attention kernels share: one warp's step over a 16-key
// tile on tensor cores, its shared-memory ring of K/V tiles, and the query
// fragments. The split-KV kernel (cuda_attention_decode.cu) gives a block's
// four warps the tiles of one (sequence, KV head, split); the stream kernel
// (cuda_attention_decode_stream.cu) gives each warp an equal run of the
// batch's tiles, across (sequence, KV head) boundaries.
//
// Fragment layouts (PTX m16n8k16; lane = 4 g + t): A regs {row g, k 2t}, {row
// g+8, k 2t}, {row g, k 2t+8}, {row g+8, k 2t+8}; B regs {k 2t, n g}, {k 2t+8,
// n g}; C {row g, n 2t, 2t+1}, {row g+8, n 2t, 2t+1}. S = Q K^T puts heads on
// rows and keys on n, which is exactly the B layout of P^T in O^T = V^T P^T
// (d on rows, heads on n); NH = 2 uses rows g+8 (heads 8-15) as a second n tile.
#include <math_constants.h>

#include <type_traits>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda::decode {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kTile = kDecodeKeyTile;  // keys per warp step: the MMA's n (2 x 8) and k (16)
constexpr int kStages = 2;             // tiles per warp ring: one computing, one in flight
constexpr int kHeadsPerBlock = 16;     // the MMA's m: query heads of one block

__host__ __device__ constexpr int head_blocks(int group) { return (group + kHeadsPerBlock - 1) / kHeadsPerBlock; }

// Shared memory of a decode block for head_dim D: each warp's ring, and
// `extra` bytes after it (or over it: the split kernel's combine buffer).
template <int D>
struct DecodeSmem {
  static constexpr int DP = (D + 15) / 16 * 16;  // head_dim padded to the MMA's k (only D = 8 pads)
  // Row stride in elements: an odd number of 16-byte units, so that the eight
  // rows one ldmatrix reads fall in different banks.
  static constexpr int RS = (DP / 8) % 2 ? DP : DP + 8;
  static constexpr int TILE_ELEMS = kTile * RS;             // one K or V tile
  static constexpr int STAGE_BYTES = 2 * TILE_ELEMS * 2;    // K then V
  static constexpr int RING_BYTES = kWarps * kStages * STAGE_BYTES;
};

// One warp's ring: slots of (K tile, V tile), STAGE_BYTES apart.
template <int D>
struct WarpRing {
  using Sm = DecodeSmem<D>;
  static constexpr int NCH = D / 8;                          // 16-byte chunks per key row
  static constexpr int CPL = (kTile * NCH + 31) / 32;        // chunks per lane per tile, of K and of V
  uint32_t base;  // shared address of slot 0

  // D = 8: zero the padding columns once; cp.async never writes them.
  __device__ void zero_padding(unsigned char* ring, int lane) const {
    if constexpr (Sm::DP != D) {
      for (int r = lane; r < kStages * 2 * kTile; r += 32)
        *reinterpret_cast<uint4*>(ring + (r * Sm::RS + D) * 2) = make_uint4(0, 0, 0, 0);
    }
  }

  // Copies one tile into slot `slot`: lane L (and L + 16) holds the pool
  // offset `off` of key L of the tile (-1 past the context: zeros, since P
  // there is 0 and 0 * V must be 0); consecutive lanes copy consecutive
  // 16-byte chunks of a key row.
  __device__ __forceinline__ void issue(int slot, int64_t off, int lane, const bf16* k_pool,
                                        const bf16* v_pool) const {
    const uint32_t ks = base + slot * Sm::STAGE_BYTES, vs = ks + Sm::TILE_ELEMS * 2;
#pragma unroll
    for (int u = 0; u < CPL; ++u) {
      const int c = lane + 32 * u, key = c / NCH, ch = c % NCH;
      const int64_t o = __shfl_sync(0xffffffffu, off, key & 31);
      if ((kTile * NCH) % 32 == 0 || c < kTile * NCH) {
        const int bytes = o >= 0 ? 16 : 0;
        const int64_t src = o >= 0 ? o + ch * 8 : 0;
        const uint32_t dst = uint32_t(key * Sm::RS + ch * 8) * 2;
        ptx::cp_async_16_l2_128(ks + dst, k_pool + src, bytes);
        ptx::cp_async_16_l2_128(vs + dst, v_pool + src, bytes);
      }
    }
  }
};

// Issues the first kStages tiles (those of `count` that exist, pool offsets
// `first`) into slots from_slot, from_slot + 1, ... (the slots before it are
// issued already): one cp.async group per slot, empty or not, so that
// wait_group counts tiles.
template <int D>
__device__ __forceinline__ void prime_ring(const WarpRing<D>& ring, const int64_t (&first)[kStages], int64_t count,
                                           int lane, const bf16* k_pool, const bf16* v_pool, int from_slot = 0) {
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    if (st < from_slot) continue;
    if (st < count) ring.issue(st, first[st], lane, k_pool, v_pool);
    ptx::cp_async_commit();
  }
}

// Q rows h0 .. h0 + GL - 1 (heads of one block, row stride D) as MMA A
// fragments (rows = heads, k = d); rows past GL are 0.
template <int D, int NH>
__device__ __forceinline__ void load_q(uint32_t (&qa)[DecodeSmem<D>::DP / 16][4], const bf16* qbase, int GL, int g,
                                       int t) {
#pragma unroll
  for (int kk = 0; kk < DecodeSmem<D>::DP / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i & 1), d = 16 * kk + 8 * (i >> 1) + 2 * t;
      qa[kk][i] = (i & 1) < NH && row < GL && d < D ? *reinterpret_cast<const uint32_t*>(qbase + row * D + d) : 0u;
    }
}

// One warp's online-softmax state: (max, sum) of heads g (+8) per lane (the
// quad's four lanes hold parts of the sum), and O^T's accumulators.
template <int D, int NH>
struct WarpState {
  static constexpr int MT = DecodeSmem<D>::DP / 16;
  float m[NH], l[NH], acc[NH][MT][4];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < NH; ++r) {
      m[r] = -CUDART_INF_F;
      l[r] = 0.0f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][mt][c] = 0.0f;
    }
  }

  // Calls out(h, d, v) for each output value this lane holds: v = O[h][d] *
  // scale(r, c) for head column h = 8 r + 2 t + c and dimension d < D (every
  // lane calls scale, so it may shuffle).
  template <typename Scale, typename Out>
  __device__ __forceinline__ void for_each_output(int g, int t, Scale scale, Out out) const {
#pragma unroll
    for (int r = 0; r < NH; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float k = scale(r, c);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const int d = 16 * mt + g + 8 * hi;
            if (d < D) out(8 * r + 2 * t + c, d, acc[r][mt][2 * hi + c] * k);
          }
      }
  }

  // Sums l over the quad: afterwards every lane of quad g holds heads g (+8)'s.
  __device__ __forceinline__ void reduce_l() {
#pragma unroll
    for (int r = 0; r < NH; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
  }

  // One tile at shared addresses ks / vs (this lane's ldmatrix rows): S = Q
  // K^T, the online softmax of keys key0 .. key0 + 15 (those at n_ctx and past
  // masked, and with kWindow those before key_lo), O^T += V^T P^T. Every tile
  // has a live key.
  template <bool kWindow = false>
  __device__ __forceinline__ void step(const uint32_t (&qa)[DecodeSmem<D>::DP / 16][4], uint32_t ks, uint32_t vs,
                                       int key0, int n_ctx, float scale_log2, int t, int key_lo = 0) {
    constexpr int KC = DecodeSmem<D>::DP / 16;
    float sc[2][4] = {};  // S for keys 0-7 and 8-15 of the tile
#pragma unroll
    for (int kk = 0; kk < KC; ++kk) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, ks + kk * 32);
      ptx::mma_bf16_16816(sc[0], qa[kk], b[0], b[1]);
      ptx::mma_bf16_16816(sc[1], qa[kk], b[2], b[3]);
    }
    // Heads g (+8): this lane has keys 2t, 2t+1, 8+2t, 9+2t; the quad has the tile's 16.
    uint32_t pb[NH][2];
    float alpha[NH];
#pragma unroll
    for (int r = 0; r < NH; ++r) {
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + (e >> 1) * 8 + 2 * t + (e & 1);
        const bool live = kWindow ? key < n_ctx && key >= key_lo : key < n_ctx;
        x[e] = live ? sc[e >> 1][2 * r + (e & 1)] * scale_log2 : -CUDART_INF_F;
      }
      float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      alpha[r] = exp2f(m[r] - m_new);
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = exp2f(x[e] - m_new);
      l[r] = l[r] * alpha[r] + ((x[0] + x[1]) + (x[2] + x[3]));  // this lane's part; the quad sums at the end
      m[r] = m_new;
      pb[r][0] = ptx::pack_bf16x2(x[0], x[1]);
      pb[r][1] = ptx::pack_bf16x2(x[2], x[3]);
    }
    // The accumulators' columns are heads 2t, 2t+1 (+8): their alphas live in lanes 8t and 8t + 4.
#pragma unroll
    for (int r = 0; r < NH; ++r) {
      const float a_even = __shfl_sync(0xffffffffu, alpha[r], 8 * t);
      const float a_odd = __shfl_sync(0xffffffffu, alpha[r], 8 * t + 4);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        acc[r][mt][0] *= a_even;
        acc[r][mt][1] *= a_odd;
        acc[r][mt][2] *= a_even;
        acc[r][mt][3] *= a_odd;
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t a[4];
      ptx::ldmatrix_x4_trans(a, vs + mt * 32);
#pragma unroll
      for (int r = 0; r < NH; ++r) ptx::mma_bf16_16816(acc[r][mt], a, pb[r][0], pb[r][1]);
    }
  }
};

// ldmatrix row addresses: lanes 8m..8m+7 give the rows of matrix m = (keys
// 0-7 | 8-15) x (d 0-7 | 8-15) of a 16 x 16 block, in the order the fragments
// want (the same order serves K and, transposed, V).
template <int D>
__device__ __forceinline__ uint32_t ldmatrix_offset(int lane) {
  return uint32_t(((lane & 7) + ((lane >> 4) << 3)) * DecodeSmem<D>::RS + ((lane >> 3) & 1) * 8) * 2;
}

// Calls f(std::integral_constant<int, D>) for a compiled head_dim.
template <typename F>
bool with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 8: f(std::integral_constant<int, 8>{}); return true;
    case 16: f(std::integral_constant<int, 16>{}); return true;
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 80: f(std::integral_constant<int, 80>{}); return true;
    case 96: f(std::integral_constant<int, 96>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    case 256: f(std::integral_constant<int, 256>{}); return true;
    default: return false;
  }
}

inline bool two_head_tiles(int group) { return (group < kHeadsPerBlock ? group : kHeadsPerBlock) > 8; }

}  // namespace serval::cuda::decode
