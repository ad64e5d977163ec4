// y = x @ W^T for a few rows of x (decode batches of up to 16 tokens), and
// the MLP's fused silu(x @ gate^T) * (x @ up^T): a stream over W that must run
// at the full HBM bandwidth.
//
// Work is cut into units of 8 consecutive W rows (8 outputs per token). A
// block of 4 warps takes one unit at a time and its warps split the unit's
// columns: warp w takes k-steps w*8 .. w*8+7 of every 32 (a k-step is 32
// columns), so the block reads 2 KB of each row at a time, contiguously. A
// warp computes with one tensor-core mma.m16n8k16 per 16 columns: A = 16
// tokens of x (rows past T are zeros), B = the 8 W rows, f32 accumulators.
// Each lane loads whole 16-byte chunks of W and x; the mma's k order is a
// permutation of the columns, the same for A and B, so the dot products are
// unchanged. The block sums its 4 warps' partials in shared memory.
//
// Bandwidth: each lane has 8 slots of 16 bytes per weight (a warp: 4 KB of
// W, 8 KB for gate + up) and refills slot s with the next batch's step s as
// soon as s has fed its mmas, across a unit's end too, so about a batch stays
// in flight all the time, the epilogue included (one weight for up to 4
// tokens, gemv_deep_kernel: two batches). The grid is persistent and
// balanced: every block gets the same number of units (ceil(units / resident
// blocks)), so no block runs a last unit alone while the rest of the GPU
// idles. With programmatic dependent launch the first weight loads are issued
// before waiting for the previous kernel (griddepcontrol.wait comes before any
// read of x and any write of y), and each thread calls
// griddepcontrol.launch_dependents once it has issued its last weight loads,
// so the next kernel's blocks can take our SMs as our blocks finish.
//
// Batch invariance: the output (t, j) is, whatever T is (1..16), the same
// chain of mma accumulations over the same k-steps in each warp, then
// warp 0 + warp 1 + warp 2 + warp 3 in that order. Token t only occupies
// row t of A, and an mma's row t of D depends on row t of A alone, so a
// token's result is bitwise the same alone or inside a batch (and in a
// fused q/k/v launch or a single one). The split (4 warps x 8 steps) is
// the same in every kernel variant; do not make it depend on T.
//
// The RMSNorm between a projection into the residual and the next GEMV can be
// done by the two GEMVs (GemvNorm, cuda_decode_matmul.h; cuda_norm_fold.cu
// decides when): the first adds into the residual in its epilogue, the second
// scales its sums by the rows' 1 / rms before its own epilogue. Both keep the
// units, k split and sums above, so batch invariance holds.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_gemv_unit.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda {

namespace {

using namespace gemv_unit;

// This block's share of the launch: x's 16-byte chunks per row, k-step
// batches per unit (per warp), and batches over all its units.
struct BlockWork {
  int chunks, batches, total;
};
__device__ __forceinline__ BlockWork block_work(const GemvParams& p) {
  const int chunks = p.in >> 3;
  const int steps = (chunks + kStepChunks - 1) / kStepChunks;
  const int batches = (steps + kWarps * kSteps - 1) / (kWarps * kSteps);
  const int my_units = (p.tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1;  // blockIdx.x < units
  return {chunks, batches, my_units * batches};
}

// Unit i of this block of the persistent grid.
template <bool kGated>
__device__ __forceinline__ UnitRows unit_rows(const GemvParams& p, int i, int g) {
  return tile_rows<kGated>(p, int(blockIdx.x) + i * int(gridDim.x), g);
}

// kHighTokens: tokens 8..15 exist (T > 8), so the lanes also load their rows of
// x into A's rows 8..15; otherwise those rows are zero registers.
// kNorm: GemvNorm::Mode. Gate + up for 9..16 tokens takes 168 registers (3
// blocks per SM); its kConsume form is held to that (unbounded: 196, 2 blocks).
template <bool kGated, bool kHighTokens, int kNorm>
constexpr int gemv_min_blocks() {
  return kNorm == GemvNorm::kConsume && kGated && kHighTokens ? 3 : 0;  // 0: no bound
}
template <typename Out, bool kGated, bool kHighTokens, bool kRope = false, int kNorm = GemvNorm::kNone>
__global__ void __launch_bounds__(kThreads, gemv_min_blocks<kGated, kHighTokens, kNorm>())
    gemv_kernel(const __grid_constant__ GemvParams p, const __grid_constant__ GemvRopeKv r,
                const __grid_constant__ GemvNorm nrm) {
  // Per lane, the accumulators handed to the reduction: D's (token g, rows 2q,
  // 2q+1), plus (token g+8, ...) with high tokens; for gate and for up if gated.
  constexpr int kAcc = kHighTokens ? 4 : 2;
  constexpr int kVals = kGated ? 2 * kAcc : kAcc;
  __shared__ float partial[2][kWarps][kVals][32];  // double-buffered by unit parity
  __shared__ float ss[kMaxTokens];                  // kConsume: the sums of squares of x's rows
  GemvNormState st;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;  // mma groupID, threadID_in_group
  const auto [chunks, batches, total] = block_work(p);

  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  // Lane (g, q) holds token g's (and g+8's) x chunks and W row `base + g`.
  const bool x_lo = g < p.tokens, x_hi = kHighTokens && g + 8 < p.tokens;
  const bf16* x_lo_row = p.x + int64_t(g) * p.in;
  const bf16* x_hi_row = p.x + int64_t(kHighTokens ? g + 8 : g) * p.in;

  uint4 wv[kSteps], uv[kGated ? kSteps : 1], xl[kSteps], xh[kHighTokens ? kSteps : 1];
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc_up[4] = {0.f, 0.f, 0.f, 0.f};

  // The load cursor: batch `lb` of this block's unit `li`, whose row this lane reads.
  int li = 0, lb = 0;
  const bf16* w_row = p.w[0];
  const bf16* u_row = p.w[1];
  bool row_ok = false;
  auto enter_unit = [&](int i) {
    const UnitRows r = unit_rows<kGated>(p, i, g);
    w_row = r.w;
    if constexpr (kGated) u_row = r.u;
    row_ok = r.ok;
  };
  // Step s of batch `lb` of the load cursor's unit into slot s; `more` false
  // (no batch left) loads nothing.
  auto load_step = [&](int s, bool more) {
    const int c = ((lb * kWarps + warp) * kSteps + s) * kStepChunks + q;
    const bool in_row = more && c < chunks;
    const bool ok = in_row && row_ok;
    const int off = in_row ? c * 8 : 0;
    wv[s] = load_weight(w_row + off, ok, policy);
    if constexpr (kGated) uv[s] = load_weight(u_row + off, ok, policy);
    xl[s] = load_act(x_lo_row + off, in_row && x_lo);
    if constexpr (kHighTokens) xh[s] = load_act(x_hi_row + off, in_row && x_hi);
  };
  // Slot s's two mmas (per weight): chunk words 0,1 are one mma's k pairs
  // (2q, 2q+1) and (2q+8, 2q+9), words 2,3 the next's.
  auto compute_step = [&](int s) {
    uint4 hi = make_uint4(0, 0, 0, 0);
    if constexpr (kHighTokens) hi = xh[s];
    const uint32_t a_lo[4] = {xl[s].x, hi.x, xl[s].y, hi.y}, a_hi[4] = {xl[s].z, hi.z, xl[s].w, hi.w};
    ptx::mma_bf16_16816(acc, a_lo, wv[s].x, wv[s].y);
    ptx::mma_bf16_16816(acc, a_hi, wv[s].z, wv[s].w);
    if constexpr (kGated) {
      ptx::mma_bf16_16816(acc_up, a_lo, uv[s].x, uv[s].y);
      ptx::mma_bf16_16816(acc_up, a_hi, uv[s].z, uv[s].w);
    }
  };
  auto epilogue = [&](int i) {
    const int tile = int(blockIdx.x) + i * int(gridDim.x);
    // Scales of its own (kGemvNormOwnScalesMaxTokens) only for gate + up: q/k/v
    // of that few rows goes to the deep kernel.
    constexpr bool kOwnScales = kGated && !kHighTokens;
    finish_unit<Out, kGated, kAcc, kVals, kRope, kNorm, kOwnScales>(p, r, partial, acc, acc_up, tile, i & 1, 0, &nrm,
                                                                    &st, ss, i == 0);
    if constexpr (kNorm == GemvNorm::kProduce)
      if (warp == 0 && i + 1 < total / batches) load_residual<kAcc>(p, nrm, tile + int(gridDim.x), st);
  };
  if (total == 0) return;  // no block is launched without a unit; kept for safety
  // Batch 0's weights first; x is the previous kernel's output, so wait for
  // it (and only then may y be written) before loading x.
  enter_unit(0);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int c = ((lb * kWarps + warp) * kSteps + s) * kStepChunks + q;
    const bool ok = row_ok && c < chunks;
    wv[s] = load_weight(w_row + (ok ? c * 8 : 0), ok, policy);
    if constexpr (kGated) uv[s] = load_weight(u_row + (ok ? c * 8 : 0), ok, policy);
  }
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int c = ((lb * kWarps + warp) * kSteps + s) * kStepChunks + q;
    const int off = c < chunks ? c * 8 : 0;
    xl[s] = load_act(x_lo_row + off, x_lo && c < chunks);
    if constexpr (kHighTokens) xh[s] = load_act(x_hi_row + off, x_hi && c < chunks);
  }
  if constexpr (kNorm == GemvNorm::kProduce)
    if (warp == 0) load_residual<kAcc>(p, nrm, int(blockIdx.x), st);
  if constexpr (kNorm == GemvNorm::kConsume)
    if (warp == 0 && nrm.scales != nullptr) load_scales<kAcc>(p, nrm, st);
  if (total == 1) pdl_launch_dependents();
  // A rolling window: as soon as slot s has fed its mmas, it is refilled with
  // step s of the next batch (possibly of the next unit), so nearly a whole
  // batch stays in flight while the mma chain runs and through the epilogue.
  int ci = 0, cb = 0;  // the unit and batch being computed
  for (int idx = 0; idx < total; ++idx) {
    const bool more = idx + 1 < total;
    if (more && ++lb == batches) {
      lb = 0;
      enter_unit(++li);
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      compute_step(s);
      load_step(s, more);
    }
    if (idx + 2 == total) pdl_launch_dependents();
    if (++cb == batches) {
      epilogue(ci++);
      cb = 0;
    }
  }
}

// One weight for up to 8 tokens (used up to kDeepMaxTokens: every batch-1
// decode matmul but gate + up): the same units, k split, mma chain and sums
// as gemv_kernel (so the same bits), but x is not held in slots. It is an L1
// hit (every warp of the SM reads the same x) loaded one step ahead of its
// mmas, and the registers it freed hold a second batch of weight loads: 2 x 8 slots per lane, 4 blocks
// of 128 registers per SM, 128 KB of W in flight per SM instead of 80. (For
// gate + up, and for 9..16 tokens, whose x loads then sit in the mma chain,
// that measured slower, so they keep gemv_kernel.)
constexpr int kDeepMaxTokens = 4;  // the tokens it is used for (it handles up to 8)
static_assert(kGemvNormOwnScalesMaxTokens <= kDeepMaxTokens, "q/k/v with rope gets its own scales in the deep kernel");
template <typename Out, bool kRope = false, int kNorm = GemvNorm::kNone>
__global__ void __launch_bounds__(kThreads, 4) gemv_deep_kernel(const __grid_constant__ GemvParams p,
                                                                const __grid_constant__ GemvRopeKv r,
                                                                const __grid_constant__ GemvNorm nrm) {
  constexpr int kDepth = 2;  // batches of weight loads in flight per lane
  __shared__ float partial[2][kWarps][2][32];
  __shared__ float ss[kMaxTokens];  // kConsume
  GemvNormState st;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const auto [chunks, batches, total] = block_work(p);

  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const bool x_ok = g < p.tokens;
  const bf16* x_row = p.x + int64_t(g) * p.in;

  uint4 wv[kDepth][kSteps];
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, unused[4] = {0.f, 0.f, 0.f, 0.f};

  // The load cursor (batch lb of unit li) runs kDepth batches ahead of the
  // computed one (batch cb of unit ci).
  int li = 0, lb = 0;
  UnitRows rows = unit_rows<false>(p, 0, g);
  auto advance_load = [&] {
    if (++lb == batches) {
      lb = 0;
      rows = unit_rows<false>(p, ++li, g);
    }
  };
  auto load_step = [&](int d, int s, bool more) {
    const int c = ((lb * kWarps + warp) * kSteps + s) * kStepChunks + q;
    const bool ok = more && rows.ok && c < chunks;
    wv[d][s] = load_weight(rows.w + (ok ? c * 8 : 0), ok, policy);
  };
  auto load_x = [&](int b, int s) {
    const int c = ((b * kWarps + warp) * kSteps + s) * kStepChunks + q;
    return load_act(x_row + (c < chunks ? c * 8 : 0), x_ok && c < chunks);
  };

  if (total == 0) return;
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    const bool more = d < total;
    if (d > 0 && more) advance_load();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) load_step(d, s, more);
  }
  pdl_wait();  // x is the previous kernel's output; y may be written only now
  uint4 x_cur = load_x(0, 0);
  if constexpr (kNorm == GemvNorm::kProduce)
    if (warp == 0) load_residual<2>(p, nrm, int(blockIdx.x), st);
  if constexpr (kNorm == GemvNorm::kConsume)
    if (warp == 0 && nrm.scales != nullptr) load_scales<2>(p, nrm, st);
  if (total <= kDepth) pdl_launch_dependents();
  int ci = 0, cb = 0;
  for (int first = 0; first < total; first += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int idx = first + d;
      if (idx >= total) break;
      const bool more = idx + kDepth < total;  // slot set d is refilled with batch idx + kDepth
      if (more) advance_load();
      const int next_b = cb + 1 == batches ? 0 : cb + 1;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const uint4 x_next = s + 1 < kSteps ? load_x(cb, s + 1) : load_x(next_b, 0);
        const uint32_t z = 0;
        const uint32_t a_lo[4] = {x_cur.x, z, x_cur.y, z}, a_hi[4] = {x_cur.z, z, x_cur.w, z};
        ptx::mma_bf16_16816(acc, a_lo, wv[d][s].x, wv[d][s].y);
        ptx::mma_bf16_16816(acc, a_hi, wv[d][s].z, wv[d][s].w);
        load_step(d, s, more);
        x_cur = x_next;
      }
      if (idx + kDepth + 1 == total) pdl_launch_dependents();  // the last weight loads are out
      if (++cb == batches) {
        const int tile = int(blockIdx.x) + ci * int(gridDim.x);
        finish_unit<Out, false, 2, 2, kRope, kNorm, true>(p, r, partial, acc, unused, tile, ci & 1, 0, &nrm, &st,
                                                          ss, ci == 0);
        if constexpr (kNorm == GemvNorm::kProduce)
          if (warp == 0 && ci + 1 < total / batches) load_residual<2>(p, nrm, tile + int(gridDim.x), st);
        ++ci;
        cb = 0;
      }
    }
  }
}

template <auto kKernel>
void launch_as(const GemvParams& p, const GemvRopeKv& r, const GemvNorm& n, const Launch& on) {
  // Balanced persistent grid: the fewest units per block that fit the resident
  // blocks, and just enough blocks for that, so every block gets the same
  // count (the last ones one fewer at most). Depends on the shape only.
  const int per_block = ceil_div(p.tiles, resident_blocks<kKernel>(on));
  const int blocks = ceil_div(p.tiles, per_block);
  launch_pdl(kKernel, dim3(unsigned(blocks)), dim3(kThreads), 0, on, p, r, n);
}

// The kernel for up to kMaxTokens rows in norm mode kNorm.
template <typename Out, bool kGated, int kNorm>
void launch_small(const GemvParams& p, const GemvRopeKv& r, const GemvNorm& n, const Launch& on) {
  if constexpr (!kGated && std::is_same_v<Out, bf16> && kNorm != GemvNorm::kProduce) {
    if (r.positions != nullptr) {  // the rope epilogue: its own variants, the others keep their registers
      if (p.tokens > 8) return launch_as<gemv_kernel<bf16, false, true, true, kNorm>>(p, r, n, on);
      if (p.tokens <= kDeepMaxTokens) return launch_as<gemv_deep_kernel<bf16, true, kNorm>>(p, r, n, on);
      return launch_as<gemv_kernel<bf16, false, false, true, kNorm>>(p, r, n, on);
    }
  }
  if constexpr (kNorm == GemvNorm::kConsume && !kGated) {
    fail("gemv: a norm's scales are taken by q/k/v with rope and by gate/up only");
  } else {
    if (p.tokens > 8) return launch_as<gemv_kernel<Out, kGated, true, false, kNorm>>(p, r, n, on);
    // The deep kernel up to 4 tokens: at 8 its launches alone are faster too,
    // but 8-sequence decode steps measured 1.4% slower with it.
    if constexpr (!kGated)
      if (p.tokens <= kDeepMaxTokens) return launch_as<gemv_deep_kernel<Out, false, kNorm>>(p, r, n, on);
    launch_as<gemv_kernel<Out, kGated, false, false, kNorm>>(p, r, n, on);
  }
}

template <typename Out, bool kGated>
void launch_typed(const GemvParams& p, const GemvRopeKv& r, const GemvNorm& n, const Launch& on) {
  if (p.tokens > kMaxTokens) {
    SERVAL_CHECK(n.mode == GemvNorm::kNone, "gemv: a norm in the GEMV needs at most ", kMaxTokens, " rows");
    if constexpr (!kGated && std::is_same_v<Out, bf16>)
      if (r.positions != nullptr) return launch_wide<bf16, false, true>(p, r, on);
    return launch_wide<Out, kGated, false>(p, r, on);
  }
  if (n.mode == GemvNorm::kNone) return launch_small<Out, kGated, GemvNorm::kNone>(p, r, n, on);
  if constexpr (std::is_same_v<Out, bf16>) {
    if constexpr (!kGated)
      if (n.mode == GemvNorm::kProduce && r.positions == nullptr)
        return launch_small<bf16, false, GemvNorm::kProduce>(p, r, n, on);
    if (n.mode == GemvNorm::kConsume) return launch_small<bf16, kGated, GemvNorm::kConsume>(p, r, n, on);
  }
  fail("gemv: no kernel for norm mode ", int(n.mode), kGated ? " (gated)" : "", r.positions ? " (rope)" : "");
}

template <bool kGated>
void launch(const GemvParams& p, bool f32, const Launch& on, const GemvRopeKv& r = {}, const GemvNorm& n = {}) {
  if (f32)
    launch_typed<float, kGated>(p, r, n, on);
  else
    launch_typed<bf16, kGated>(p, r, n, on);
}

// A GemvNorm the kernels can take with these operands (n outputs).
void check_norm(const GemvNorm& norm, const GemvParams& p, int n) {
  if (norm.mode == GemvNorm::kNone) return;
  SERVAL_CHECK(p.tokens <= kMaxTokens, "gemv: a norm needs at most ", kMaxTokens, " rows");
  if (norm.mode == GemvNorm::kProduce) {
    SERVAL_CHECK(n == 1 && norm.residual != nullptr && p.rows[0] % kUnitRows == 0,
                 "gemv: a norm's producer has one output of whole units of ", kUnitRows, " rows");
  } else {
    SERVAL_CHECK(norm.cols == p.in, "gemv: a norm over ", norm.cols, " columns for x of ", p.in);
    SERVAL_CHECK(norm.scales != nullptr || p.tokens <= kGemvNormOwnScalesMaxTokens, "gemv: a norm's scales for ",
                 p.tokens, " rows come from gemv_row_scales");
  }
}

// GemvNorm's scales: a block of one warp per row (spread over the SMs, whose
// L2 reads a row each).
__global__ void row_scales_kernel(const bf16* x, int cols, float eps, float* scales) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const float v = gemv_row_square_sum(x + t * cols, cols / 8);
  if (threadIdx.x == 0) scales[t] = gemv_norm_scale(v, cols, eps);
}

}  // namespace

void gemv_row_scales(const Tensor& x, float eps, float* scales, const Launch& on) {
  SERVAL_CHECK(x.dtype == DType::BF16 && x.rows >= 1 && x.rows <= kMaxTokens && x.cols % 8 == 0,
               "gemv_row_scales: x [", x.rows, ", ", x.cols, "] must be bf16, 1..", kMaxTokens, " rows of 8k columns");
  launch_pdl(row_scales_kernel, dim3(unsigned(x.rows)), dim3(32), 0, on, bf(x), int(x.cols), eps, scales);
  SERVAL_CUDA_LAUNCH_CHECK();
}

bool gemv_fits(const Tensor& x) { return x.rows <= kMaxTokens && gemv_any_rows_fits(x); }

bool gemv_any_rows_fits(const Tensor& x) {
  return x.dtype == DType::BF16 && x.rows >= 1 && x.rows <= (int64_t(1) << 30) && x.cols >= 8 && x.cols % 8 == 0 &&
         x.cols <= (int64_t(1) << 30) && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

// ys[i] = x @ ws[i]^T; the outputs are all bf16, or a single f32 one.
void gemv(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n, const Launch& on,
          const GemvRopeKv& rope, const GemvNorm& norm) {
  SERVAL_CHECK(gemv_any_rows_fits(x), "gemv: x [", x.rows, ", ", x.cols, "] does not fit the GEMV kernel");
  const GemvParams p = matmul_segments(x, ws, ys, n, kUnitRows, "gemv");
  if (rope.positions != nullptr) {
    const int head_dim = rope.kv.head_dim;
    const bool whole_heads = head_dim > 0 && head_dim % kUnitRows == 0 && rope.rope_dim % 2 == 0 &&
                             rope.rope_dim <= head_dim;
    SERVAL_CHECK(n == 3 && ys[0].dtype == DType::BF16 && whole_heads && p.rows[1] == p.rows[2] &&
                     p.rows[0] % head_dim == 0 && p.rows[1] == rope.kv.row(),
                 "gemv: rope in the epilogue needs q/k/v outputs of whole heads (head_dim a multiple of 8), k and v "
                 "rows of the KV pools' rows");
  }
  check_norm(norm, p, n);
  if (p.tiles > 0) launch<false>(p, ys[0].dtype == DType::F32, on, rope, norm);
}

// out = silu(x @ gate^T) * (x @ up^T), bf16; gate and up are [out.cols, x.cols].
void gemv_gated(const Tensor& x, const bf16* gate, const bf16* up, Tensor out, const Launch& on,
                const GemvNorm& norm, bool interleaved) {
  SERVAL_CHECK(gemv_any_rows_fits(x), "gemv_gated: x [", x.rows, ", ", x.cols, "] does not fit the GEMV kernel");
  static_assert(kUnitRows == kGateUpGroupRows, "an interleaved pair's unit is one group of gate rows");
  const GemvParams p = gated_segments(x, gate, up, out, kUnitRows, "gemv_gated", interleaved);
  check_norm(norm, p, 1);
  if (p.tiles > 0) launch<true>(p, false, on, {}, norm);
}

}  // namespace serval::cuda
