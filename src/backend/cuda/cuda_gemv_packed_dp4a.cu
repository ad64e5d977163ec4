// The packed GEMV's path for 1 or 2 rows of x (cuda_gemv_packed.h, int8_x):
// x quantized to int8 per group of 32 columns, the products in integers by
// dp4a, 4 multiply-adds an instruction on the quants as they are loaded.
//
// The mma path (cuda_gemv_packed.cu) turns every pair of quants into a bf16
// pair (shift, mask, subtract: about 3.4 instructions a weight with the rest),
// which caps a batch-1 Q4_0 decode at about 45% of the copy bandwidth on an
// H100. Here a word of 8 Q4_0 nibbles takes a mask, a shift and a mask, then
// two dp4a against x's bytes in the same order, and one scale per row and
// group (about 1.4 instructions a weight).
//
// Same units, loads, pipeline, grid and unit end as the mma path (a lane
// (g, q) streams chunk q of row g of each k-step; rolling window of kSteps
// loads), but each lane sums its own row: its 8 columns of each group, for
// each token. At a unit's end the quad's four lanes are summed and moved
// into the mma accumulator layout, so finish_unit (cuda_gemv_unit.cuh) does
// the warps' sum, rope, silu and the stores as for every GEMV.
//
// x: after the dependency wait each block quantizes x into shared memory, one
// 16-byte record per token, group and lane of the quad: the lane's 8 int8 in
// the order its word's bytes come out (4-bit: columns 0,4,1,5 | 2,6,3,7, see
// backend/gpu_block_pack.h; 8-bit: 0..7), the offset that removes the quants'
// bias (-8 or -128 times the sum of those 8 int8), and the group's scale.
// Forms with mins add m times the lane's sum of its 8 int8 (the offset over
// -8 or -128) times x's scale; row scales multiply the row's sum at the end.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_gemv_packed_params.cuh"

namespace serval::cuda {

namespace {

using namespace gemv_unit;

// dp4a of unsigned bytes a (Q8_0's quant + 128) and signed bytes b, plus c.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t pack_bytes(int a, int b, int c, int d) {
  return (uint32_t(a) & 0xFFu) | ((uint32_t(b) & 0xFFu) << 8) | ((uint32_t(c) & 0xFFu) << 16) |
         (uint32_t(d) << 24);
}

// Quantizes x (tokens rows of `in` bf16) into records (see the top), `groups`
// groups a token (the padded width's; groups past `in` are zeros).
template <int kBits>
__device__ void quantize_x(const bf16* x, int tokens, int in, int groups, uint4* rec) {
  for (int i = int(threadIdx.x); i < tokens * groups; i += kThreads) {
    const int t = i / groups, G = i - t * groups;
    uint4 v[4] = {};
    if (32 * G < in) {
      const bf16* src = x + int64_t(t) * in + 32 * G;
#pragma unroll
      for (int c = 0; c < 4; ++c) v[c] = load_act(src + 8 * c, true);
    }
    float amax = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        amax = fmaxf(amax, fabsf(__uint_as_float(w[e] << 16)));
        amax = fmaxf(amax, fabsf(__uint_as_float(w[e] & 0xFFFF0000u)));
      }
    }
    const float dx = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // the 8 columns of lane c of the quad
      const uint32_t w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
      int qv[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        qv[2 * e] = __float2int_rn(__uint_as_float(w[e] << 16) * inv);
        qv[2 * e + 1] = __float2int_rn(__uint_as_float(w[e] & 0xFFFF0000u) * inv);
      }
      int sum = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += qv[e];
      uint4 r;
      if constexpr (kBits == 4) {
        r.x = pack_bytes(qv[0], qv[4], qv[1], qv[5]);
        r.y = pack_bytes(qv[2], qv[6], qv[3], qv[7]);
        r.z = uint32_t(-8 * sum);
      } else {
        r.x = pack_bytes(qv[0], qv[1], qv[2], qv[3]);
        r.y = pack_bytes(qv[4], qv[5], qv[6], qv[7]);
        r.z = uint32_t(-128 * sum);
      }
      r.w = __float_as_uint(dx);
      rec[(int64_t(t) * groups + G) * 4 + c] = r;
    }
  }
}

// kTok rows of x (1 or 2). kGated: segment 0 is gate and up; kRope: q/k/v
// with the rope epilogue (as gemv_packed_kernel).
template <int kForm, typename Out, int kTok, bool kGated, bool kRope>
__global__ void __launch_bounds__(kThreads) gemv_packed_dp4a_kernel(const __grid_constant__ PackedGemvParams P,
                                                                    const __grid_constant__ GemvRopeKv r,
                                                                    int groups) {
  using Step = PackedStep<kForm>;
  using F = Form<kForm>;
  constexpr int kBits = F::kBits;
  constexpr int kSlots = kGated ? kSteps / 2 : kSteps;
  constexpr int kVals = kGated ? 4 : 2;
  extern __shared__ uint4 xrec[];
  __shared__ float partial[2][kWarps][kVals][32];
  const MatmulSegments& p = P.seg;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int batches = (P.steps + kWarps * kSlots - 1) / (kWarps * kSlots);
  const int my_units = (p.tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1;
  const int total = my_units * batches;

  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  constexpr int kW = kGated ? 2 : 1;  // weights per unit
  uint4 wv[kW][kSlots];
  typename Step::Scales sv[kW][kSlots];
  typename Step::Scales mv[kW][F::kMins ? kSlots : 1];
  float acc[kW][kTok] = {};

  int li = 0, lb = 0;  // the load cursor: batch lb of this block's unit li
  const uint8_t* w_row[kW];
  const uint16_t* s_unit[kW];
  const uint16_t* m_unit[kW];
  auto enter_unit = [&](int i) {
    int seg, base;
    locate_tile(p, int(blockIdx.x) + i * int(gridDim.x), kUnitRows, seg, base);
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const int wi = kGated ? k : seg;
      w_row[k] = P.quants[wi] + int64_t(base + g) * P.row_bytes;
      const int64_t at = int64_t(base / kUnitRows) * P.steps * 4 * Step::kScaleGroups * 2;
      s_unit[k] = P.scales[wi] + at;
      if constexpr (F::kMins) m_unit[k] = P.mins[wi] + at;
    }
  };
  // Row g's scales sit in the slot of lane g / 2 (the pair of rows 2l, 2l + 1).
  auto load_step = [&](int s, bool more) {
    const int S = (lb * kWarps + warp) * kSlots + s;
    const bool ok = more && S < P.steps;
    const int c = ok ? 4 * S + q : 0, cs = ok ? 4 * S + (g >> 1) : 0;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      wv[k][s] = load_weight(w_row[k] + int64_t(c) * 16, ok, policy);
      if constexpr (!F::kRowScale) {
        const int64_t at = int64_t(cs) * Step::kScaleGroups * 2;
        sv[k][s] = load_scales<kForm>(s_unit[k] + at, ok, policy);
        if constexpr (F::kMins) mv[k][s] = load_scales<kForm>(m_unit[k] + at, ok, policy);
      }
    }
  };
  auto compute_step = [&](int s, int cb) {
    const int S = (cb * kWarps + warp) * kSlots + s;
    if (S >= P.steps) return;  // past the row: no x records
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const uint32_t w[4] = {wv[k][s].x, wv[k][s].y, wv[k][s].z, wv[k][s].w};
#pragma unroll
      for (int j = 0; j < Step::kGroups; ++j) {
        float dw = 1.f, mw = 0.f;  // row scales: applied at the unit's end
        if constexpr (!F::kRowScale)
          dw = __half2float(__ushort_as_half(uint16_t(scale_word(sv[k][s], j / Step::kSubs) >> (16 * (g & 1)))));
        if constexpr (F::kMins)
          mw = __half2float(__ushort_as_half(uint16_t(scale_word(mv[k][s], j / Step::kSubs) >> (16 * (g & 1)))));
        const uint32_t a = kBits == 4 ? w[j] & 0x0F0F0F0Fu : w[2 * j];
        const uint32_t b = kBits == 4 ? (w[j] >> 4) & 0x0F0F0F0Fu : w[2 * j + 1];
        const int G = S * Step::kGroups + j;
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          const uint4 x = xrec[(t * groups + G) * 4 + q];
          int dot;
          if constexpr (kBits == 4)
            dot = dp4a_ss(b, x.y, dp4a_ss(a, x.x, int(x.z)));
          else
            dot = dp4a_us(b, x.y, dp4a_us(a, x.x, int(x.z)));
          acc[k][t] = fmaf(float(dot), dw * __uint_as_float(x.w), acc[k][t]);
          if constexpr (F::kMins) {  // w = d * (n - 8) + (m + 8 d) (4-bit), d * v + m (8-bit)
            const float lane_sum = float(int(x.z)) * (kBits == 4 ? -0.125f : -1.f / 128.f);
            const float o = kBits == 4 ? fmaf(8.f, dw, mw) : mw;
            acc[k][t] = fmaf(lane_sum, o * __uint_as_float(x.w), acc[k][t]);
          }
        }
      }
    }
  };
  // The quad's sum of row g for each token, moved to the mma layout: lane
  // (g, q) gets token g's rows 2q and 2q + 1 (finish_unit's acc[0], acc[1]).
  auto to_mma_layout = [&](const float (&a)[kTok], float (&out)[4]) {
    float v[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      v[t] = a[t] + __shfl_xor_sync(0xFFFFFFFFu, a[t], 1);
      v[t] += __shfl_xor_sync(0xFFFFFFFFu, v[t], 2);
    }
    out[0] = out[1] = out[2] = out[3] = 0.f;
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      const float lo = __shfl_sync(0xFFFFFFFFu, v[t], 8 * q);
      const float hi = __shfl_sync(0xFFFFFFFFu, v[t], 8 * q + 4);
      if (g == t) out[0] = lo, out[1] = hi;
    }
  };

  if (total <= 0) return;
  enter_unit(0);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) load_step(s, true);
  pdl_wait();  // x is the previous kernel's output; y may be written only now
  quantize_x<kBits>(p.x, p.tokens, p.in, groups, xrec);
  __syncthreads();
  if (total == 1) pdl_launch_dependents();
  int ci = 0, cb = 0;  // the unit and batch being computed
  for (int idx = 0; idx < total; ++idx) {
    const bool more = idx + 1 < total;
    if (more && ++lb == batches) {
      lb = 0;
      enter_unit(++li);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      compute_step(s, cb);
      load_step(s, more);
    }
    if (idx + 2 == total) pdl_launch_dependents();
    if (++cb == batches) {
      const int tile = int(blockIdx.x) + ci * int(gridDim.x);
      if constexpr (F::kRowScale) {  // this lane's row g
        int seg, base;
        locate_tile(p, tile, kUnitRows, seg, base);
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          const float rs = __ldg(reinterpret_cast<const float*>(P.scales[kGated ? k : seg]) + base + g);
#pragma unroll
          for (int t = 0; t < kTok; ++t) acc[k][t] *= rs;
        }
      }
      float c0[4], c1[4];
      to_mma_layout(acc[0], c0);
      to_mma_layout(acc[kW - 1], c1);
#pragma unroll
      for (int k = 0; k < kW; ++k)
#pragma unroll
        for (int t = 0; t < kTok; ++t) acc[k][t] = 0.f;
      finish_unit<Out, kGated, 2, kVals, kRope>(p, r, partial, c0, c1, tile, ci & 1, 0);
      ++ci;
      cb = 0;
    }
  }
}

// Resident blocks with `smem` bytes of x records (the grid is planned as the
// mma path's: balanced and persistent).
template <auto kKernel>
int resident_blocks_with(const Launch& on, int smem) {
  static PerDevice<bool> raised;
  int dev = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  raised.get(dev, [] {
    SERVAL_CUDA_CHECK(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDp4aMaxSmem)));
    return true;
  });
  int blocks = 0;
  SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, kThreads, size_t(smem)));
  return std::max(blocks, 1) * (on.grid_sms > 0 ? on.grid_sms : device_sms(on));
}

template <auto kKernel>
void launch_dp4a(const PackedGemvParams& P, int64_t padded_cols, const GemvRopeKv& r, const Launch& on) {
  const int smem = int(dp4a_x_bytes(P.seg.tokens, padded_cols));
  const int per_block = ceil_div(P.seg.tiles, resident_blocks_with<kKernel>(on, smem));
  launch_pdl(kKernel, dim3(unsigned(ceil_div(P.seg.tiles, per_block))), dim3(kThreads), size_t(smem), on, P, r,
             int(padded_cols / 32));
}

}  // namespace

template <int kForm, typename Out, bool kGated, bool kRope>
void launch_packed_dp4a(const PackedGemvParams& P, int64_t padded_cols, const GemvRopeKv& r, const Launch& on) {
  if (P.seg.tokens == 1) return launch_dp4a<gemv_packed_dp4a_kernel<kForm, Out, 1, kGated, kRope>>(P, padded_cols, r, on);
  launch_dp4a<gemv_packed_dp4a_kernel<kForm, Out, 2, kGated, kRope>>(P, padded_cols, r, on);
}

#define SERVAL_PACKED_DP4A(FORM, OUT, GATED, ROPE)                                                        \
  template void launch_packed_dp4a<FORM, OUT, GATED, ROPE>(const PackedGemvParams&, int64_t, const GemvRopeKv&, \
                                                          const Launch&);
#define SERVAL_PACKED_DP4A_FORM(FORM)            \
  SERVAL_PACKED_DP4A(FORM, bf16, false, false)   \
  SERVAL_PACKED_DP4A(FORM, float, false, false)  \
  SERVAL_PACKED_DP4A(FORM, bf16, true, false)    \
  SERVAL_PACKED_DP4A(FORM, bf16, false, true)
SERVAL_PACKED_DP4A_FORM(kFormQ4)
SERVAL_PACKED_DP4A_FORM(kFormQ4Min)
SERVAL_PACKED_DP4A_FORM(kFormQ4G64)
SERVAL_PACKED_DP4A_FORM(kFormQ4G64Min)
SERVAL_PACKED_DP4A_FORM(kFormQ4G128)
SERVAL_PACKED_DP4A_FORM(kFormQ4G128Min)
SERVAL_PACKED_DP4A_FORM(kFormQ8)
SERVAL_PACKED_DP4A_FORM(kFormQ8Min)
SERVAL_PACKED_DP4A_FORM(kFormQ8Row)
#undef SERVAL_PACKED_DP4A_FORM
#undef SERVAL_PACKED_DP4A

}  // namespace serval::cuda
