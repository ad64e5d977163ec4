#pragma once
// The GEMV's unit of work, shared by its kernels (cuda_gemv.cu) and the
// batch-invariant wide kernel (cuda_gemv_wide.cu), which must compute every
// row exactly as they do: the block shape and k split, the weight and x
// loads, a unit's W rows, and a unit's end (the warps' sum in a fixed order,
// the stores, the rope epilogue). See cuda_gemv.cu for the design.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_tensor.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "backend/cuda/cuda_matmul_segments.cuh"
#include "backend/cuda/cuda_rope.cuh"

namespace serval::cuda::gemv_unit {

constexpr int kWarps = 4;  // warps per block; they split each unit's columns
constexpr int kThreads = 32 * kWarps;
constexpr int kUnitRows = 8;    // W rows per unit: the mma's N
constexpr int kSteps = 8;       // k-steps per warp per batch (loads in flight per lane per weight)
constexpr int kStepChunks = 4;  // 16-byte chunks of a row per k-step: one per lane of a quad
constexpr int kMaxTokens = 16;  // the mma's M

// The operands (cuda_matmul_segments.cuh); its tiles are this kernel's units.
using GemvParams = MatmulSegments;

// 16 bytes of W, streamed: no L1 allocation, evict-first in L2 (W is read once
// per step and must not push activations out), and a 256-byte L2 fetch, since
// the next three k-steps of the row follow right behind. `ok` false gives zeros
// without touching memory.
__device__ __forceinline__ uint4 load_weight(const void* p, bool ok, uint64_t policy) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%5], %6;\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "r"(int(ok)), "l"(p), "l"(policy));
  return v;
}

// 16 bytes of x: kept in L1, where every warp of the SM reads it again. Not
// through the non-coherent path (.nc) as the weights are: x is written by the
// previous kernel, which a programmatic dependent launch lets run during this
// kernel's lifetime, and .nc loads require data that is read-only for the
// whole lifetime (with .nc, CUDA graphs replayed stale x for 9-16 rows).
__device__ __forceinline__ uint4 load_act(const bf16* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.global.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%5];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "r"(int(ok)), "l"(p));
  return v;
}

// Unit `tile` of the launch: the W rows lane (g, q) reads (row `base + g` of
// its segment, or of gate and up) and whether that row exists.
struct UnitRows {
  const bf16* w;
  const bf16* u;
  bool ok;
};
template <bool kGated>
__device__ __forceinline__ UnitRows tile_rows(const GemvParams& p, int tile, int g) {
  int seg, base;
  locate_tile(p, tile, kUnitRows, seg, base);
  const int row = base + g;
  const bool ok = row < p.rows[seg];
  const int64_t off = (kGated && p.interleaved ? gate_up_row(ok ? row : 0) : int64_t(ok ? row : 0)) * p.in;
  return {p.w[kGated ? 0 : seg] + off, kGated ? p.w[1] + off : nullptr, ok};
}
// A GEMV block's part of a GemvNorm (cuda_decode_matmul.h).
struct GemvNormState {
  // kConsume, warp 0 (from the first unit end without GemvNorm::scales): the
  // scales of tokens g and g + 8.
  float scale[2] = {0.f, 0.f};
  // kProduce, warp 0: the residual under the unit's outputs, indexed as
  // finish_unit's sums.
  float res[4] = {0.f, 0.f, 0.f, 0.f};
};

// ss plus the squares of the 8 bf16 values of `chunk`, in order.
__device__ __forceinline__ float add_squares(float ss, uint4 chunk) {
  const uint32_t w[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    ss = fmaf(f.x, f.x, ss);
    ss = fmaf(f.y, f.y, ss);
  }
  return ss;
}

// The sum of the squares of a bf16 row of `chunks` 16-byte chunks, by one
// warp: lane l takes chunks l, l + 32, ... in order (four loads in flight),
// then the butterfly; every lane gets it. Its order depends on the row alone
// (GemvNorm's two ways of scaling must give a row the same bits).
__device__ __forceinline__ float gemv_row_square_sum(const bf16* x, int chunks) {
  const int lane = threadIdx.x & 31;
  const uint4* row = reinterpret_cast<const uint4*>(x);
  float v = 0.f;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) v = add_squares(v, row[c]);
  return warp_sum(v);
}
__device__ __forceinline__ float gemv_norm_scale(float square_sum, int cols, float eps) {
  return rsqrtf(square_sum / float(cols) + eps);
}

// kConsume without `scales`, every thread at the block's first unit end: the
// sums of squares of x's rows into ss[t] (warp t % 4 sums row t). x is an L1
// hit by now: every warp of the SM has read it.
__device__ __forceinline__ void x_squares(const GemvParams& p, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = warp; t < p.tokens; t += kWarps) {
    const float v = gemv_row_square_sum(p.x + int64_t(t) * p.in, p.in / 8);
    if (lane == 0) ss[t] = v;
  }
}

// kConsume with `scales`, warp 0 after the dependency wait: its tokens' scales.
template <int kAcc>
__device__ __forceinline__ void load_scales(const GemvParams& p, const GemvNorm& n, GemvNormState& st) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int h = 0; h < kAcc / 2; ++h) st.scale[h] = g + 8 * h < p.tokens ? n.scales[g + 8 * h] : 0.f;
}

// kProduce, warp 0, when a unit (tile `tile`) starts: the residual values its
// outputs will add into, in finish_unit's order (token g + 8 h, row 2 q + e).
template <int kAcc>
__device__ __forceinline__ void load_residual(const GemvParams& p, const GemvNorm& n, int tile,
                                              GemvNormState& st) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t col = int64_t(tile) * kUnitRows + 2 * q;  // one segment: the tile is the unit
#pragma unroll
  for (int h = 0; h < kAcc / 2; ++h) {
    const int t = g + 8 * h;
#pragma unroll
    for (int e = 0; e < 2; ++e) st.res[2 * h + e] = t < p.tokens ? n.residual[int64_t(t) * p.rows[0] + col + e] : 0.f;
  }
}

// The end of a unit (tile `tile` of the launch) for the tokens from t0 (0,
// or a group of 16 in gemv_wide_kernel): the 4 warps' partials are summed in
// shared memory (warp 0 + 1 + 2 + 3, in that order) and warp 0 writes the
// unit's outputs (silu(g) * u if gated); the accumulators restart at zero.
// Consecutive calls alternate `buf`. kNorm (GemvNorm::Mode, with `nrm`, the
// block's `st` and `ss` in shared memory): with kConsume the sums are first
// scaled (at the block's `first` unit end, x_squares' sums become the scales
// when the launch has no `scales`, which only kernels with kOwnScales take);
// with kProduce they go into the residual.
template <typename Out, bool kGated, int kAcc, int kVals, bool kRope = false, int kNorm = GemvNorm::kNone,
          bool kOwnScales = false>
__device__ __forceinline__ void finish_unit(const GemvParams& p, const GemvRopeKv& r,
                                            float (&partial)[2][kWarps][kVals][32], float (&acc)[4],
                                            float (&acc_up)[4], int tile, int buf, int t0,
                                            const GemvNorm* nrm = nullptr, GemvNormState* st = nullptr,
                                            float* ss = nullptr, bool first = false) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  if constexpr (kNorm == GemvNorm::kConsume)
    if constexpr (kOwnScales)
      if (first && nrm->scales == nullptr) x_squares(p, ss);
#pragma unroll
  for (int v = 0; v < kAcc; ++v) {
    partial[buf][warp][v][lane] = acc[v];
    if constexpr (kGated) partial[buf][warp][kAcc + v][lane] = acc_up[v];
  }
#pragma unroll
  for (int v = 0; v < 4; ++v) acc[v] = acc_up[v] = 0.f;
  // One barrier per unit: buffer `buf` is written again two units later, after
  // the next unit's barrier, which warp 0 reaches only once it has read it.
  __syncthreads();
  if (warp != 0) return;
  float sum[kVals];
#pragma unroll
  for (int v = 0; v < kVals; ++v) sum[v] = partial[buf][0][v][lane];
#pragma unroll
  for (int w = 1; w < kWarps; ++w)
#pragma unroll
    for (int v = 0; v < kVals; ++v) sum[v] += partial[buf][w][v][lane];
  int seg, base;
  locate_tile(p, tile, kUnitRows, seg, base);
  const int rows = p.rows[seg];
  Out* y = static_cast<Out*>(p.y[seg]);
  if constexpr (kNorm == GemvNorm::kConsume) {
#pragma unroll
    for (int h = 0; h < kAcc / 2; ++h) {
      const int t = g + 8 * h;
      if constexpr (kOwnScales)
        if (first && nrm->scales == nullptr) st->scale[h] = gemv_norm_scale(ss[t], nrm->cols, nrm->eps);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sum[2 * h + e] *= st->scale[h];
        if constexpr (kGated) sum[kAcc + 2 * h + e] *= st->scale[h];
      }
    }
  }
  static_assert(kNorm != GemvNorm::kProduce || (!kGated && !kRope && std::is_same_v<Out, bf16>),
                "kProduce: one plain bf16 output");
  if constexpr (kRope && !kGated && std::is_same_v<Out, bf16>) {
    // The pair (j, j + 1) as the GEMV would store it, rotated as the rope
    // kernel would (same sincosf, same rope_rotate), stored where that
    // kernel would put it. Rows are whole heads, so both exist.
    const int j = base + 2 * q;
#pragma unroll
    for (int h = 0; h < kAcc / 2; ++h) {
      const int t = t0 + g + 8 * h;
      if (t >= p.tokens || j >= rows) continue;
      float a = __bfloat162float(__float2bfloat16(sum[2 * h]));
      float b = __bfloat162float(__float2bfloat16(sum[2 * h + 1]));
      const int d = j % r.kv.head_dim;
      if (seg < 2 && d < r.rope_dim) {
        float sn, cs;
        sincosf(float(r.positions[t]) * r.inv_freq[d / 2], &sn, &cs);
        rope_rotate(a, b, cs, sn, a, b);
      }
      bf16* dst = seg == 0 ? y + int64_t(t) * rows : r.kv.at(seg == 2, r.slots[t]);
      store1(dst, j, a);
      store1(dst, j + 1, b);
    }
  } else {
#pragma unroll
    for (int h = 0; h < kAcc / 2; ++h) {
      const int t = t0 + g + 8 * h;
      if (t >= p.tokens) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = base + 2 * q + e;
        if (j >= rows) continue;
        float v = sum[2 * h + e];
        if constexpr (kGated) v = v / (1.0f + __expf(-v)) * sum[kAcc + 2 * h + e];
        if constexpr (kNorm == GemvNorm::kProduce) {  // into the residual, rounded as y; the sum is the next x
          v = st->res[2 * h + e] + __bfloat162float(__float2bfloat16(v));
          nrm->residual[int64_t(t) * rows + j] = v;
        }
        store1(y, int64_t(t) * rows + j, v);
      }
    }
  }
}

// Resident blocks of a kernel on `sms` SMs (Launch::grid_sms; 0: all of the
// device's). The hardware spreads the blocks over every SM, so planning for
// fewer SMs means fewer weight bytes in flight GPU-wide (CudaTuning::gemv_sms,
// a measuring tool).
template <auto kKernel>
int resident_blocks(const Launch& on) {
  int dev = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  // A property of the kernel on this device's architecture, read once per device.
  static PerDevice<int> per_sm;
  const int n = per_sm.get(dev, [] {
    int blocks = 0;
    SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, kThreads, 0));
    return std::max(blocks, 1);
  });
  return n * (on.grid_sms > 0 ? on.grid_sms : device_sms(on));
}

// More than kMaxTokens rows, any T (cuda_gemv_wide.cu): the wide kernel.
template <typename Out, bool kGated, bool kRope>
void launch_wide(const GemvParams& p, const GemvRopeKv& r, const Launch& on);

}  // namespace serval::cuda::gemv_unit
