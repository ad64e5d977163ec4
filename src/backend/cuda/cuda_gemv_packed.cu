// The packed GEMV (cuda_gemv_packed.h): y = x @ W^T for 1..16 rows of x, W
// packed as backend/gpu_block_pack.h lays it out (GGUF Q4_0, Q8_0, Q4_1,
// Q4_K, Q5_K; int4 g32/64/128; int8 per channel), read at its size (4.125 to
// 8.5 bits a weight instead of bf16's 16).
//
// It is the bf16 GEMV's design (cuda_gemv.cu) with quantized loads: units of
// 8 W rows, a block of 4 warps per unit, each warp a share of the k-steps,
// a lane (g, q) of an mma quad reading row g's chunk q of each k-step with one
// 16-byte load (32 Q4_0 or 16 Q8_0 weights), a rolling window of 8 loads in
// flight, a persistent balanced grid, programmatic dependent launch. The
// quants become bf16 in registers, exactly (small integers): Q4_0 through
// the 0x4300 | nibble trick (bf16 128 + n, then - 136), Q8_0 through f32
// 2^23 + byte. Each group's 32 columns are two mma.m16n8k16 into fresh
// accumulators, which are scaled by the group's scales (f16, for the rows
// the lane's accumulators hold: the layout stores them so) and added in f32.
// Groups of 64 or 128 columns (int4): the 32-column mmas of a group sum into
// the same fresh accumulators, scaled once. Mins: two more mmas of x by a
// fragment of ones give each token's sum of x over the group, which the
// min multiplies (w = d * n + m: d * (sum of x (n - 8) + 8 sum x) + m * sum x).
// Row scales (int8 per channel): the mmas sum straight into the unit's
// accumulators, scaled by each row's f32 scale at the unit's end.
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_gemv_packed.h"
#include "backend/cuda/cuda_gemv_packed_params.cuh"
#include "backend/cuda/cuda_gemv_unit.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda {

namespace {

using namespace gemv_unit;

// 8 columns of x from `col` (zeros where the token or the columns do not
// exist). A plain load: x is the previous kernel's output (see load_act).
__device__ __forceinline__ uint4 load_x(const bf16* row, int col, bool ok) {
  return ok ? *reinterpret_cast<const uint4*>(row + col) : make_uint4(0, 0, 0, 0);
}

// Q4_0 nibbles at bits 0..3 and 16..19 of v as the bf16 pair (n - 8).
__device__ __forceinline__ uint32_t q4_pair(uint32_t v) {
  uint32_t h = (v & 0x000F000Fu) | 0x43004300u;  // bf16 128 + n
  __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162*>(&h);
  b = __hsub2(b, __floats2bfloat162_rn(136.f, 136.f));
  return *reinterpret_cast<uint32_t*>(&b);
}
// Q8_0 bytes k and k + 1 of v (quant + 128) as the bf16 pair of quants.
__device__ __forceinline__ uint32_t q8_pair(uint32_t v, int k) {
  const float lo = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | unsigned(k))) - 8388736.f;
  const float hi = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | unsigned(k + 1))) - 8388736.f;
  return ptx::pack_bf16x2(lo, hi);
}

// kGated: segment 0 is gate and up (quants[0], quants[1]), y = silu(g) * u.
// kRope: q/k/v in three segments, rotated and written to the KV pools as the
// bf16 GEMV's rope epilogue does (finish_unit). Each lane keeps kSlots
// k-steps of loads in flight per weight (gate + up: half as many each).
template <int kForm, typename Out, bool kHighTokens, bool kGated, bool kRope>
__global__ void __launch_bounds__(kThreads) gemv_packed_kernel(const __grid_constant__ PackedGemvParams P,
                                                               const __grid_constant__ GemvRopeKv r) {
  using Step = PackedStep<kForm>;
  using F = Form<kForm>;
  constexpr int kBits = F::kBits, kSubs = Step::kSubs;
  constexpr int kSlots = kGated ? kSteps / 2 : kSteps;
  constexpr int kAcc = kHighTokens ? 4 : 2;
  constexpr int kVals = kGated ? 2 * kAcc : kAcc;
  __shared__ float partial[2][kWarps][kVals][32];
  const MatmulSegments& p = P.seg;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int batches = (P.steps + kWarps * kSlots - 1) / (kWarps * kSlots);
  const int my_units = (p.tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1;
  const int total = my_units * batches;

  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const bool x_lo = g < p.tokens, x_hi = kHighTokens && g + 8 < p.tokens;
  const bf16* x_lo_row = p.x + int64_t(g) * p.in;
  const bf16* x_hi_row = p.x + int64_t(kHighTokens ? g + 8 : g) * p.in;

  constexpr int kW = kGated ? 2 : 1;  // weights per unit
  uint4 wv[kW][kSlots];
  typename Step::Scales sv[kW][kSlots];
  typename Step::Scales mv[kW][F::kMins ? kSlots : 1];
  float acc[kW][4] = {};

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
  auto load_step = [&](int s, bool more) {
    const int S = (lb * kWarps + warp) * kSlots + s;
    const bool ok = more && S < P.steps;
    const int c = ok ? 4 * S + q : 0;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      wv[k][s] = load_weight(w_row[k] + int64_t(c) * 16, ok, policy);
      if constexpr (!F::kRowScale) {
        const int64_t at = int64_t(c) * Step::kScaleGroups * 2;
        sv[k][s] = load_scales<kForm>(s_unit[k] + at, ok, policy);
        if constexpr (F::kMins) mv[k][s] = load_scales<kForm>(m_unit[k] + at, ok, policy);
      }
    }
  };
  // A scale group's sums t (and the group's sums of x, xs) scaled into acc[k].
  auto scale_group = [&](int k, const float (&t)[4], const float (&xs)[4], const typename Step::Scales& sv_,
                         const typename Step::Scales& mv_, int jj) {
    const uint32_t sc = scale_word(sv_, jj);
    const float2 d = __half22float2(*reinterpret_cast<const __half2*>(&sc));
    if constexpr (F::kMins) {
      const uint32_t mw = scale_word(mv_, jj);
      const float2 m = __half22float2(*reinterpret_cast<const __half2*>(&mw));
      constexpr float kBias = kBits == 4 ? 8.f : 0.f;  // 4-bit t sums x * (n - 8)
#pragma unroll
      for (int e = 0; e < (kHighTokens ? 4 : 2); ++e) {
        const float de = e % 2 == 0 ? d.x : d.y, me = e % 2 == 0 ? m.x : m.y;
        acc[k][e] = fmaf(fmaf(kBias, xs[e], t[e]), de, fmaf(xs[e], me, acc[k][e]));
      }
    } else {
      acc[k][0] = fmaf(t[0], d.x, acc[k][0]);
      acc[k][1] = fmaf(t[1], d.y, acc[k][1]);
      if constexpr (kHighTokens) {
        acc[k][2] = fmaf(t[2], d.x, acc[k][2]);
        acc[k][3] = fmaf(t[3], d.y, acc[k][3]);
      }
    }
  };
  // Slot s of batch cb: per scale group, two mmas per 32 columns into fresh
  // accumulators, scaled into acc (row scales: the mmas sum into acc).
  auto compute_step = [&](int s, int cb) {
    const int S = (cb * kWarps + warp) * kSlots + s;
    constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 1, 1
    float t[kW][4], xs[4];
#pragma unroll
    for (int j = 0; j < Step::kGroups; ++j) {
      const int col = S * Step::kCols + 32 * j + 8 * q;
      const bool in_row = col < p.in;
      const uint4 xl = load_x(x_lo_row, col, in_row && x_lo);
      const uint4 xh = kHighTokens ? load_x(x_hi_row, col, in_row && x_hi) : make_uint4(0, 0, 0, 0);
      const uint32_t a_lo[4] = {xl.x, xh.x, xl.y, xh.y}, a_hi[4] = {xl.z, xh.z, xl.w, xh.w};
      if constexpr (F::kMins) {  // each token's sum of x over the scale group
        if (j % kSubs == 0) xs[0] = xs[1] = xs[2] = xs[3] = 0.f;
        ptx::mma_bf16_16816(xs, a_lo, kOnes, kOnes);
        ptx::mma_bf16_16816(xs, a_hi, kOnes, kOnes);
      }
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const uint32_t w[4] = {wv[k][s].x, wv[k][s].y, wv[k][s].z, wv[k][s].w};
        uint32_t b[4];
        if constexpr (kBits == 4) {
#pragma unroll
          for (int m = 0; m < 4; ++m) b[m] = q4_pair(w[j] >> (4 * m));
        } else {
          b[0] = q8_pair(w[2 * j], 0), b[1] = q8_pair(w[2 * j], 2);
          b[2] = q8_pair(w[2 * j + 1], 0), b[3] = q8_pair(w[2 * j + 1], 2);
        }
        if constexpr (F::kRowScale) {
          ptx::mma_bf16_16816(acc[k], a_lo, b[0], b[1]);
          ptx::mma_bf16_16816(acc[k], a_hi, b[2], b[3]);
        } else {
          if (j % kSubs == 0) t[k][0] = t[k][1] = t[k][2] = t[k][3] = 0.f;
          ptx::mma_bf16_16816(t[k], a_lo, b[0], b[1]);
          ptx::mma_bf16_16816(t[k], a_hi, b[2], b[3]);
          if (j % kSubs == kSubs - 1) scale_group(k, t[k], xs, sv[k][s], mv[k][F::kMins ? s : 0], j / kSubs);
        }
      }
    }
  };
  // Row scales: lane (g, q)'s accumulators hold rows 2q and 2q + 1 of the unit.
  auto scale_rows = [&](int tile) {
    if constexpr (F::kRowScale) {
      int seg, base;
      locate_tile(p, tile, kUnitRows, seg, base);
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const float* rs = reinterpret_cast<const float*>(P.scales[kGated ? k : seg]) + base + 2 * q;
        const float2 v = __ldg(reinterpret_cast<const float2*>(rs));
        acc[k][0] *= v.x, acc[k][1] *= v.y, acc[k][2] *= v.x, acc[k][3] *= v.y;
      }
    }
  };

  if (total <= 0) return;
  enter_unit(0);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) load_step(s, true);
  pdl_wait();  // x is the previous kernel's output; y may be written only now
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
      scale_rows(tile);
      finish_unit<Out, kGated, kAcc, kVals, kRope>(p, r, partial, acc[0], acc[kW - 1], tile, ci & 1, 0);
      ++ci;
      cb = 0;
    }
  }
}

template <auto kKernel>
void launch_packed(const PackedGemvParams& P, const GemvRopeKv& r, const Launch& on) {
  // Balanced persistent grid, as the bf16 GEMV's (launch_as in cuda_gemv.cu).
  const int per_block = ceil_div(P.seg.tiles, resident_blocks<kKernel>(on));
  launch_pdl(kKernel, dim3(unsigned(ceil_div(P.seg.tiles, per_block))), dim3(kThreads), 0, on, P, r);
}

// int8_x: up to kDp4aMaxTokens rows go to the dp4a kernel (x quantized to
// int8; cuda_gemv_packed.h), when its shared memory holds x.
struct PackedPath {
  bool int8_x = false;
  int64_t padded_cols = 0;
};

template <int kForm, typename Out, bool kGated, bool kRope>
void launch_form(const PackedGemvParams& P, const PackedPath& path, const GemvRopeKv& r, const Launch& on) {
  if (path.int8_x && P.seg.tokens <= kDp4aMaxTokens && dp4a_x_bytes(P.seg.tokens, path.padded_cols) <= kDp4aMaxSmem)
    return launch_packed_dp4a<kForm, Out, kGated, kRope>(P, path.padded_cols, r, on);
  if (P.seg.tokens > 8) return launch_packed<gemv_packed_kernel<kForm, Out, true, kGated, kRope>>(P, r, on);
  launch_packed<gemv_packed_kernel<kForm, Out, false, kGated, kRope>>(P, r, on);
}

template <int kForm, bool kGated, bool kRope>
void launch_outputs(const PackedGemvParams& P, bool f32, const PackedPath& path, const GemvRopeKv& r,
                    const Launch& on) {
  if constexpr (kGated || kRope) {
    SERVAL_CHECK(!f32, "gemv_packed: gated and rope outputs are bf16");
    launch_form<kForm, bf16, kGated, kRope>(P, path, r, on);
  } else {
    f32 ? launch_form<kForm, float, false, false>(P, path, r, on) : launch_form<kForm, bf16, false, false>(P, path, r, on);
  }
}

template <bool kGated, bool kRope>
void launch_any(const PackedGemvParams& P, int form, bool f32, const PackedPath& path, const GemvRopeKv& r,
                const Launch& on) {
  switch (form) {
    case kFormQ4: launch_outputs<kFormQ4, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ4Min: launch_outputs<kFormQ4Min, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ4G64: launch_outputs<kFormQ4G64, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ4G64Min: launch_outputs<kFormQ4G64Min, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ4G128: launch_outputs<kFormQ4G128, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ4G128Min: launch_outputs<kFormQ4G128Min, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ8: launch_outputs<kFormQ8, kGated, kRope>(P, f32, path, r, on); break;
    case kFormQ8Min: launch_outputs<kFormQ8Min, kGated, kRope>(P, f32, path, r, on); break;
    default: launch_outputs<kFormQ8Row, kGated, kRope>(P, f32, path, r, on); break;
  }
  SERVAL_CUDA_LAUNCH_CHECK();
}

// The operands of up to three packed weights of one form and width.
PackedGemvParams packed_params(const Tensor& x, const PackedWeight* ws, int n) {
  PackedGemvParams P{};
  P.seg.x = bf(x);
  P.seg.tokens = int(x.rows);
  P.seg.in = int(x.cols);
  P.row_bytes = ws[0].pack.row_bytes();
  P.steps = int(ws[0].pack.steps());
  for (int i = 0; i < n; ++i) {
    SERVAL_CHECK(gemv_packed_fits(x, ws[i]) && ws[i].pack.same_form(ws[0].pack), "gemv_packed: x [", x.rows, ", ",
                 x.cols, "] and weight ", i, " (", ws[i].pack.bits, "-bit [", ws[i].pack.rows, ", ", ws[i].pack.cols,
                 "]) do not fit the packed GEMV");
    P.quants[i] = ws[i].quants();
    P.scales[i] = ws[i].scales();
    P.mins[i] = ws[i].mins();
  }
  return P;
}

// out[r, c] = the weight in bf16: one thread per 16-byte chunk of a row
// (blockIdx.y strides over the rows: no 64-bit divisions).
template <int kForm>
__global__ void dequantize_packed_kernel(const uint8_t* quants, const uint16_t* scales, const uint16_t* mins,
                                         int rows, int cols, int64_t row_bytes, int steps, bf16* out) {
  using Step = PackedStep<kForm>;
  using F = Form<kForm>;
  pdl_wait();
  const int c = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (c < steps * 4) {
    const int S = c / 4, q = c % 4;
    for (int r = int(blockIdx.y); r < rows; r += int(gridDim.y)) {
      const uint4 v = *reinterpret_cast<const uint4*>(quants + int64_t(r) * row_bytes + int64_t(c) * 16);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      const int u = r / kUnitRows, in_unit = r % kUnitRows;
      const int64_t at = (4 * (int64_t(u) * steps + S) + in_unit / 2) * Step::kScaleGroups * 2 + in_unit % 2;
#pragma unroll
      for (int j = 0; j < Step::kGroups; ++j) {
        const int col = S * Step::kCols + 32 * j + 8 * q;
        if (col >= cols) break;
        float d, m = 0.f;
        if constexpr (F::kRowScale) {
          d = reinterpret_cast<const float*>(scales)[r];
        } else {
          d = __half2float(__ushort_as_half(scales[at + 2 * (j / Step::kSubs)]));
          if constexpr (F::kMins) m = __half2float(__ushort_as_half(mins[at + 2 * (j / Step::kSubs)]));
        }
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          int quant;
          if constexpr (F::kBits == 4)
            quant = int((w[j] >> ((e % 2) * 16 + 4 * (e / 2))) & 15) - (F::kMins ? 0 : 8);
          else
            quant = int((w[2 * j + e / 4] >> (8 * (e % 4))) & 255) - 128;
          if constexpr (F::kMins)
            f[e] = float(quant) * d + m;
          else
            f[e] = d * float(quant);
        }
        *reinterpret_cast<Bf16x8*>(out + int64_t(r) * cols + col) = f32_to_bf16x8(f);
      }
    }
  }
  pdl_launch_dependents();
}

template <int kForm>
void launch_dequantize(const PackedWeight& w, bf16* out, const Launch& on) {
  const GpuBlockPack& pk = w.pack;
  const int chunks = int(pk.steps() * 4);
  const dim3 grid(unsigned(ceil_div(chunks, 128)), unsigned(std::min<int64_t>(pk.rows, 65535)));
  launch_pdl(dequantize_packed_kernel<kForm>, grid, dim3(128), 0, on, w.quants(), w.scales(), w.mins(),
             int(pk.rows), int(pk.cols), pk.row_bytes(), int(pk.steps()), out);
}

}  // namespace

bool gemv_packed_fits(const Tensor& x, const PackedWeight& w) {
  return x.dtype == DType::BF16 && x.rows >= 1 && x.rows <= kMaxTokens && x.cols == w.pack.cols &&
         x.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && w.pack.padded_rows < (int64_t(1) << 31);
}

void gemv_packed(const Tensor& x, const PackedWeight* ws, const Tensor* ys, int n, const Launch& on,
                 const GemvRopeKv& rope, bool int8_x) {
  SERVAL_CHECK(n >= 1 && n <= 3, "gemv_packed: ", n, " weights in one launch (1..3)");
  PackedGemvParams P = packed_params(x, ws, n);
  P.seg.segments = n;
  for (int i = 0; i < n; ++i) {
    SERVAL_CHECK(ys[i].rows == x.rows && ys[i].cols == ws[i].pack.rows &&
                     (ys[i].dtype == DType::BF16 || (ys[i].dtype == DType::F32 && n == 1)),
                 "gemv_packed: y [", ys[i].rows, ", ", ys[i].cols, "] for x [", x.rows, ", ", x.cols, "] and W [",
                 ws[i].pack.rows, ", ", ws[i].pack.cols, "] (bf16, or one f32 output)");
    P.seg.y[i] = ys[i].data;
    P.seg.rows[i] = int(ws[i].pack.rows);
    P.seg.tiles += int(ws[i].pack.padded_rows / GpuBlockPack::kUnitRows);
    P.seg.tile_end[i] = P.seg.tiles;
  }
  const bool f32 = ys[0].dtype == DType::F32;
  const PackedPath path{int8_x, ws[0].pack.padded_cols};
  if (rope.positions != nullptr) {
    const int hd = rope.kv.head_dim;
    SERVAL_CHECK(n == 3 && !f32 && hd > 0 && hd % kUnitRows == 0 && rope.rope_dim % 2 == 0 && rope.rope_dim <= hd &&
                     P.seg.rows[0] % hd == 0 && P.seg.rows[1] == P.seg.rows[2] && P.seg.rows[1] == rope.kv.row(),
                 "gemv_packed: rope in the epilogue needs q/k/v outputs of whole heads (head_dim a multiple of 8), k ",
                 "and v rows of the KV pools' rows");
    return launch_any<false, true>(P, packed_form(ws[0].pack), false, path, rope, on);
  }
  launch_any<false, false>(P, packed_form(ws[0].pack), f32, path, rope, on);
}

void gemv_packed_gated(const Tensor& x, const PackedWeight& gate, const PackedWeight& up, const Tensor& out,
                       const Launch& on, bool int8_x) {
  const PackedWeight ws[2] = {gate, up};
  PackedGemvParams P = packed_params(x, ws, 2);
  SERVAL_CHECK(gate.pack.rows == up.pack.rows && out.dtype == DType::BF16 && out.rows == x.rows &&
                   out.cols == gate.pack.rows,
               "gemv_packed_gated: gate [", gate.pack.rows, ", ", gate.pack.cols, "] and up [", up.pack.rows, ", ",
               up.pack.cols, "] do not fit out [", out.rows, ", ", out.cols, "] (bf16)");
  P.seg.segments = 1;
  P.seg.y[0] = out.data;
  P.seg.rows[0] = int(gate.pack.rows);
  P.seg.tiles = P.seg.tile_end[0] = int(gate.pack.padded_rows / GpuBlockPack::kUnitRows);
  launch_any<true, false>(P, packed_form(gate.pack), false, PackedPath{int8_x, gate.pack.padded_cols}, {}, on);
}

void dequantize_packed(const PackedWeight& w, bf16* out, const Launch& on) {
  switch (packed_form(w.pack)) {
    case kFormQ4: launch_dequantize<kFormQ4>(w, out, on); break;
    case kFormQ4Min: launch_dequantize<kFormQ4Min>(w, out, on); break;
    case kFormQ4G64: launch_dequantize<kFormQ4G64>(w, out, on); break;
    case kFormQ4G64Min: launch_dequantize<kFormQ4G64Min>(w, out, on); break;
    case kFormQ4G128: launch_dequantize<kFormQ4G128>(w, out, on); break;
    case kFormQ4G128Min: launch_dequantize<kFormQ4G128Min>(w, out, on); break;
    case kFormQ8: launch_dequantize<kFormQ8>(w, out, on); break;
    case kFormQ8Min: launch_dequantize<kFormQ8Min>(w, out, on); break;
    default: launch_dequantize<kFormQ8Row>(w, out, on); break;
  }
  SERVAL_CUDA_LAUNCH_CHECK();
}

int packed_form(const GpuBlockPack& p) {
  if (p.bits == 8 && p.group == 32) return p.row_scale ? kFormQ8Row : p.mins ? kFormQ8Min : kFormQ8;
  if (p.bits == 4 && !p.row_scale) {
    if (p.group == 32) return p.mins ? kFormQ4Min : kFormQ4;
    if (p.group == 64) return p.mins ? kFormQ4G64Min : kFormQ4G64;
    if (p.group == 128) return p.mins ? kFormQ4G128Min : kFormQ4G128;
  }
  SERVAL_CHECK(false, "gemv_packed: no kernel for a ", p.bits, "-bit pack of group ", p.group);
  return kFormQ4;
}

}  // namespace serval::cuda
