#pragma once
// The split decode kernel's rope and KV write (AttnRopeFold): q rotated on its
// way into the MMA fragments, and the new key and value rotated, written to
// their slot and patched into the warp's copy of their tile. Every value is
// rotated by rope_rotate from the same bf16 inputs and angles as the rope +
// KV write kernel (cuda_rope.cu) and rounded to bf16 the same way, so the
// pools and the attention output are bitwise those of the two kernels.
#include "backend/cuda/cuda_attention_decode_tile.cuh"
#include "backend/cuda/cuda_rope.cuh"

namespace serval::cuda::decode {

// Angle i = float(pos) * inv_freq[i] (as in the rope kernels) into cs: its
// cos at cs[i], its sin at cs[half + i]. Thread i computes angle i (half <=
// 128, the block's threads); `freq` is its inv_freq[i].
__device__ __forceinline__ void rope_angle(float* cs, int i, int pos, float freq, int half) {
  if (i < half) sincosf(float(pos) * freq, &cs[half + i], &cs[i]);
}

// The column whose value pairs with column d: d + half or d - half under NeoX
// rope (pairs (i, i + half)); d itself under interleaved rope (pairs (2i,
// 2i + 1), both in one bf16 pair) and past rope_dim.
__device__ __forceinline__ int rope_partner(int d, const AttnRopeFold& f) {
  const int half = f.rope_dim / 2;
  return !f.neox || d >= f.rope_dim ? d : d < half ? d + half : d - half;
}

// Columns d and d + 1 (d even) of one head's row after rope, as a bf16 pair,
// from their values `own` and their partners' (rope_partner). No loads here:
// callers issue every load of a row before the first rotation, so that the
// rotations wait on one round trip rather than one each.
__device__ __forceinline__ uint32_t rotate_pair(uint32_t own, uint32_t partner, int d, const float* cs,
                                                const AttnRopeFold& f) {
  if (d >= f.rope_dim) return own;
  const int half = f.rope_dim / 2;
  const __nv_bfloat162 o = *reinterpret_cast<const __nv_bfloat162*>(&own);
  const __nv_bfloat162 q = *reinterpret_cast<const __nv_bfloat162*>(&partner);
  float lo, hi, unused;
  if (!f.neox) {
    rope_rotate(__low2float(o), __high2float(o), cs[d / 2], cs[half + d / 2], lo, hi);
  } else if (d < half) {  // the first of each pair: a cos - b sin
    rope_rotate(__low2float(o), __low2float(q), cs[d], cs[half + d], lo, unused);
    rope_rotate(__high2float(o), __high2float(q), cs[d + 1], cs[half + d + 1], hi, unused);
  } else {  // the second: b cos + a sin
    const int i = d - half;
    rope_rotate(__low2float(q), __low2float(o), cs[i], cs[half + i], unused, lo);
    rope_rotate(__high2float(q), __high2float(o), cs[i + 1], cs[half + i + 1], unused, hi);
  }
  return ptx::pack_bf16x2(lo, hi);
}

// load_q of rows h0 .. h0 + GL - 1 of an unrotated q (row stride D), rotated.
template <int D, int NH>
__device__ __forceinline__ void load_q_rope(uint32_t (&qa)[DecodeSmem<D>::DP / 16][4], const bf16* qbase, int GL,
                                            int g, int t, const float* cs, const AttnRopeFold& f) {
  constexpr int KC = DecodeSmem<D>::DP / 16;
  uint32_t partner[KC][4];
  auto live = [&](int kk, int i) { return (i & 1) < NH && g + 8 * (i & 1) < GL && 16 * kk + 8 * (i >> 1) + 2 * t < D; };
#pragma unroll
  for (int kk = 0; kk < KC; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i & 1), d = 16 * kk + 8 * (i >> 1) + 2 * t;
      const bf16* r = qbase + row * D;
      qa[kk][i] = live(kk, i) ? *reinterpret_cast<const uint32_t*>(r + d) : 0u;
      partner[kk][i] = live(kk, i) && f.neox ? *reinterpret_cast<const uint32_t*>(r + rope_partner(d, f)) : 0u;
    }
#pragma unroll
  for (int kk = 0; kk < KC; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (live(kk, i)) qa[kk][i] = rotate_pair(qa[kk][i], partner[kk][i], 16 * kk + 8 * (i >> 1) + 2 * t, cs, f);
}

// The new token's key and value of one KV head, rotated: lane L holds 16-byte
// chunks L, L + 32, ... of the 2 D / 8 chunks of (K row, V row). NeoX rope
// needs rope_dim / 2 to be a multiple of 8 (a chunk's partners are a chunk).
template <int D>
struct NewKeyPatch {
  static constexpr int NCH = D / 8, PER_LANE = (2 * NCH + 31) / 32;
  uint4 chunk[PER_LANE];

  // Rotates k (and copies v) of the token whose rows start at k_row / v_row,
  // and writes both to the pools at k_dst / v_dst (the token's slot, this head).
  __device__ __forceinline__ void make(const bf16* k_row, const bf16* v_row, bf16* k_dst, bf16* v_dst, int lane,
                                       const float* cs, const AttnRopeFold& f) {
    uint4 partner[PER_LANE];
#pragma unroll
    for (int u = 0; u < PER_LANE; ++u) {  // every load first
      const int c = lane + 32 * u;
      if (c >= 2 * NCH) continue;
      chunk[u] = *reinterpret_cast<const uint4*>(c < NCH ? k_row + 8 * c : v_row + 8 * (c - NCH));
      partner[u] = c < NCH && f.neox ? *reinterpret_cast<const uint4*>(k_row + rope_partner(8 * c, f)) : chunk[u];
    }
#pragma unroll
    for (int u = 0; u < PER_LANE; ++u) {
      const int c = lane + 32 * u;
      if (c >= 2 * NCH) continue;
      if (c < NCH) {
        chunk[u].x = rotate_pair(chunk[u].x, partner[u].x, 8 * c, cs, f);
        chunk[u].y = rotate_pair(chunk[u].y, partner[u].y, 8 * c + 2, cs, f);
        chunk[u].z = rotate_pair(chunk[u].z, partner[u].z, 8 * c + 4, cs, f);
        chunk[u].w = rotate_pair(chunk[u].w, partner[u].w, 8 * c + 6, cs, f);
        *reinterpret_cast<uint4*>(k_dst + 8 * c) = chunk[u];
      } else {
        *reinterpret_cast<uint4*>(v_dst + 8 * (c - NCH)) = chunk[u];
      }
    }
  }

  // Puts the rows into key row `r` of a ring stage (K tile at `stage`, V tile
  // after it), over what the tile's copy read from the slot.
  __device__ __forceinline__ void patch(unsigned char* stage, int r, int lane) const {
    using Sm = DecodeSmem<D>;
#pragma unroll
    for (int u = 0; u < PER_LANE; ++u) {
      const int c = lane + 32 * u;
      if (c >= 2 * NCH) continue;
      const int tile = c < NCH ? 0 : 1, ch = c < NCH ? c : c - NCH;
      *reinterpret_cast<uint4*>(stage + (tile * Sm::TILE_ELEMS + r * Sm::RS + 8 * ch) * 2) = chunk[u];
    }
  }
};

}  // namespace serval::cuda::decode
