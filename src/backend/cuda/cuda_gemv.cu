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
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_matmul_segments.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda {

namespace {

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
__device__ __forceinline__ uint4 load_weight(const bf16* p, bool ok, uint64_t policy) {
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
  const int64_t off = int64_t(ok ? row : 0) * p.in;
  return {p.w[kGated ? 0 : seg] + off, kGated ? p.w[1] + off : nullptr, ok};
}
// Unit i of this block of the persistent grid.
template <bool kGated>
__device__ __forceinline__ UnitRows unit_rows(const GemvParams& p, int i, int g) {
  return tile_rows<kGated>(p, int(blockIdx.x) + i * int(gridDim.x), g);
}

// The end of a unit (tile `tile` of the launch) for the tokens from t0 (0,
// or a group of 16 in gemv_wide_kernel): the 4 warps' partials are summed in
// shared memory (warp 0 + 1 + 2 + 3, in that order) and warp 0 writes the
// unit's outputs (silu(g) * u if gated); the accumulators restart at zero.
// Consecutive calls alternate `buf`.
template <typename Out, bool kGated, int kAcc, int kVals, bool kRope = false>
__device__ __forceinline__ void finish_unit(const GemvParams& p, const GemvRopeKv& r,
                                            float (&partial)[2][kWarps][kVals][32], float (&acc)[4],
                                            float (&acc_up)[4], int tile, int buf, int t0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
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
  if constexpr (kRope && !kGated && std::is_same_v<Out, bf16>) {
    // The pair (j, j + 1) as the GEMV would store it, rotated as the rope
    // kernel would (same sincosf, same expressions), stored where that
    // kernel would put it. Rows are whole heads, so both exist.
    const int j = base + 2 * q;
#pragma unroll
    for (int h = 0; h < kAcc / 2; ++h) {
      const int t = t0 + g + 8 * h;
      if (t >= p.tokens || j >= rows) continue;
      float a = __bfloat162float(__float2bfloat16(sum[2 * h]));
      float b = __bfloat162float(__float2bfloat16(sum[2 * h + 1]));
      const int d = j % r.head_dim;
      if (seg < 2 && d < r.rope_dim) {
        float sn, cs;
        sincosf(float(r.positions[t]) * r.inv_freq[d / 2], &sn, &cs);
        const float ra = a * cs - b * sn, rb = b * cs + a * sn;
        a = ra;
        b = rb;
      }
      bf16* dst = seg == 0 ? y + int64_t(t) * rows : (seg == 1 ? r.k_pool : r.v_pool) + r.slots[t] * rows;
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
        store1(y, int64_t(t) * rows + j, v);
      }
    }
  }
}

// kHighTokens: tokens 8..15 exist (T > 8), so the lanes also load their rows of
// x into A's rows 8..15; otherwise those rows are zero registers.
template <typename Out, bool kGated, bool kHighTokens, bool kRope = false>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ GemvParams p,
                                                         const __grid_constant__ GemvRopeKv r) {
  // Per lane, the accumulators handed to the reduction: D's (token g, rows 2q,
  // 2q+1), plus (token g+8, ...) with high tokens; for gate and for up if gated.
  constexpr int kAcc = kHighTokens ? 4 : 2;
  constexpr int kVals = kGated ? 2 * kAcc : kAcc;
  __shared__ float partial[2][kWarps][kVals][32];  // double-buffered by unit parity

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
    finish_unit<Out, kGated, kAcc, kVals, kRope>(p, r, partial, acc, acc_up, int(blockIdx.x) + i * int(gridDim.x),
                                                 i & 1, 0);
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
template <typename Out, bool kRope = false>
__global__ void __launch_bounds__(kThreads, 4) gemv_deep_kernel(const __grid_constant__ GemvParams p,
                                                                const __grid_constant__ GemvRopeKv r) {
  constexpr int kDepth = 2;  // batches of weight loads in flight per lane
  __shared__ float partial[2][kWarps][2][32];

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
        finish_unit<Out, false, 2, 2, kRope>(p, r, partial, acc, unused, int(blockIdx.x) + ci * int(gridDim.x),
                                             ci & 1, 0);
        ++ci;
        cb = 0;
      }
    }
  }
}

// Any number of rows, for batch-invariant mode (CudaBackend's
// set_batch_invariant): the rows come in groups of 16, and each group goes
// through the GEMV's own units, k-steps, mma chain and sums (the same
// registers feed the same mmas in the same order), so every row gets the bits
// it gets from the GEMV alone, in a batch of any size. A block takes kUnits
// consecutive units (blockIdx.y) for up to kWideGroups groups (blockIdx.x):
// each lane streams its rows of every unit through a ring of kWideSlots
// k-steps, and each x load (an L1 or L2 hit, one step ahead) feeds the mmas of
// all kUnits units. The groups' blocks of the same units are neighbours in
// the grid, so they share W through L2. (H200, a 7B decode step's launches,
// graph-replayed: 7.0 / 8.8 / 25.4 ms at 17 / 64 / 256 rows, against the
// GEMV's 4.0 at 16: its x loads ride in its 8-slot ring, here they wait one
// step ahead.)
constexpr int kWideGroups = 4;
constexpr int kWideSlots = 4;
template <typename Out, bool kGated, int kUnits, bool kRope = false>
__global__ void __launch_bounds__(kThreads) gemv_wide_kernel(const __grid_constant__ GemvParams p,
                                                             const __grid_constant__ GemvRopeKv r) {
  constexpr int kVals = kGated ? 8 : 4;
  __shared__ float partial[2][kWarps][kVals][32];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int chunks = p.in >> 3;
  // This warp's k-steps, batch after batch: kSteps of every kWarps * kSteps.
  const int steps = (chunks + kStepChunks * kWarps * kSteps - 1) / (kStepChunks * kWarps * kSteps) * kSteps;
  const int tile0 = int(blockIdx.y) * kUnits, t_first = int(blockIdx.x) * kWideGroups * 16;
  const int groups = min(kWideGroups, (p.tokens - t_first + 15) / 16);
  UnitRows rows[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) rows[u] = tile_rows<kGated>(p, min(tile0 + u, p.tiles - 1), g);

  // Other blocks read these units' W for their groups: keep it in L2 then.
  uint64_t policy;
  if (gridDim.x > 1)
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  uint4 wv[kUnits][kWideSlots], uv[kUnits][kGated ? kWideSlots : 1];
  float acc[kUnits][kWideGroups][4] = {}, acc_up[kUnits][kGated ? kWideGroups : 1][4] = {};
  auto chunk = [&](int i) { return (((i / kSteps) * kWarps + warp) * kSteps + i % kSteps) * kStepChunks + q; };
  auto load_step = [&](int i, int slot) {
    const int c = chunk(i);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const bool ok = rows[u].ok && c < chunks && tile0 + u < p.tiles;
      wv[u][slot] = load_weight(rows[u].w + (ok ? c * 8 : 0), ok, policy);
      if constexpr (kGated) uv[u][slot] = load_weight(rows[u].u + (ok ? c * 8 : 0), ok, policy);
    }
  };
  // Step i's x for every group (rows g and g + 8 of each).
  auto load_x = [&](int i, uint4 (&xl)[kWideGroups], uint4 (&xh)[kWideGroups]) {
    const int c = chunk(i);
    const int off = c < chunks ? c * 8 : 0;
#pragma unroll
    for (int j = 0; j < kWideGroups; ++j) {
      const int lo = t_first + 16 * j + g, hi = lo + 8;
      const bool live = j < groups && c < chunks && i < steps;
      xl[j] = load_act(p.x + int64_t(min(lo, p.tokens - 1)) * p.in + off, live && lo < p.tokens);
      xh[j] = load_act(p.x + int64_t(min(hi, p.tokens - 1)) * p.in + off, live && hi < p.tokens);
    }
  };
#pragma unroll
  for (int slot = 0; slot < kWideSlots; ++slot) load_step(slot, slot);  // steps is a multiple of kSteps
  pdl_wait();  // x is the previous kernel's output; y may be written only now
  uint4 xl[kWideGroups], xh[kWideGroups];
  load_x(0, xl, xh);
  for (int i0 = 0; i0 < steps; i0 += kWideSlots) {
#pragma unroll
    for (int slot = 0; slot < kWideSlots; ++slot) {
      const int i = i0 + slot;
      // The next step's x is in flight during this step's mmas (loaded just
      // before them, the mmas waited on L2: 11.8 vs 8.8 ms for a 7B step's
      // launches at 64 rows on the H200).
      uint4 nl[kWideGroups], nh[kWideGroups];
      load_x(i + 1, nl, nh);
#pragma unroll
      for (int j = 0; j < kWideGroups; ++j) {
        if (j >= groups) break;
        // As gemv_kernel's compute_step: rows g and g + 8 of A, two mmas per weight.
        const uint32_t a_lo[4] = {xl[j].x, xh[j].x, xl[j].y, xh[j].y};
        const uint32_t a_hi[4] = {xl[j].z, xh[j].z, xl[j].w, xh[j].w};
#pragma unroll
        for (int u = 0; u < kUnits; ++u) {
          ptx::mma_bf16_16816(acc[u][j], a_lo, wv[u][slot].x, wv[u][slot].y);
          ptx::mma_bf16_16816(acc[u][j], a_hi, wv[u][slot].z, wv[u][slot].w);
          if constexpr (kGated) {
            ptx::mma_bf16_16816(acc_up[u][j], a_lo, uv[u][slot].x, uv[u][slot].y);
            ptx::mma_bf16_16816(acc_up[u][j], a_hi, uv[u][slot].z, uv[u][slot].w);
          }
        }
      }
      if (i + kWideSlots < steps) load_step(i + kWideSlots, slot);
#pragma unroll
      for (int j = 0; j < kWideGroups; ++j) xl[j] = nl[j], xh[j] = nh[j];
    }
  }
  pdl_launch_dependents();
  int buf = 0;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (tile0 + u >= p.tiles) break;
#pragma unroll
    for (int j = 0; j < kWideGroups; ++j) {
      if (j >= groups) break;
      float unused[4] = {};
      float(&up)[4] = kGated ? acc_up[u][kGated ? j : 0] : unused;
      finish_unit<Out, kGated, 4, kVals, kRope>(p, r, partial, acc[u][j], up, tile0 + u, buf, t_first + 16 * j);
      buf ^= 1;
    }
  }
}

// Resident blocks of a kernel on the whole GPU, read once per kernel.
template <auto kKernel>
int resident_blocks() {
  static const int blocks = [] {
    int dev = 0, sms = 0, per_sm = 0;
    SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
    SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0));
    return std::max(per_sm, 1) * sms;
  }();
  return blocks;
}

template <auto kKernel>
void launch_as(const GemvParams& p, const GemvRopeKv& r, cudaStream_t stream) {
  // Balanced persistent grid: the fewest units per block that fit the resident
  // blocks, and just enough blocks for that, so every block gets the same
  // count (the last ones one fewer at most). Depends on the shape only.
  const int per_block = ceil_div(p.tiles, resident_blocks<kKernel>());
  const int blocks = ceil_div(p.tiles, per_block);
  launch_pdl(kKernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p, r);
}

// More than kMaxTokens rows: gemv_wide_kernel, one block per (groups, units).
// The most units per block (fewest x loads per W byte) that leave at least
// two blocks per SM; any count gives the same bits.
template <typename Out, bool kGated, bool kRope>
void launch_wide(const GemvParams& p, const GemvRopeKv& r, cudaStream_t stream) {
  static const int sms = [] {
    int dev = 0, n = 0;
    SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
    SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  const int group_blocks = ceil_div(p.tokens, kWideGroups * 16);
  auto blocks = [&](int units) { return int64_t(ceil_div(p.tiles, units)) * group_blocks; };
  const int units = !kGated && blocks(4) >= 2 * sms ? 4 : blocks(2) >= 2 * sms ? 2 : 1;
  SERVAL_CHECK(ceil_div(p.tiles, units) <= 65535, "gemv: ", p.tiles, " units of ", kUnitRows,
               " rows are more than a grid holds");
  const dim3 grid(unsigned(group_blocks), unsigned(ceil_div(p.tiles, units)));
  auto go = [&](auto kernel) { launch_pdl(kernel, grid, dim3(kThreads), 0, stream, p, r); };
  if (units == 4) {
    if constexpr (!kGated) go(gemv_wide_kernel<Out, kGated, 4, kRope>);
  } else if (units == 2) {
    go(gemv_wide_kernel<Out, kGated, 2, kRope>);
  } else {
    go(gemv_wide_kernel<Out, kGated, 1, kRope>);
  }
}

template <typename Out, bool kGated>
void launch_typed(const GemvParams& p, const GemvRopeKv& r, cudaStream_t stream) {
  if (p.tokens > kMaxTokens) {
    if constexpr (!kGated && std::is_same_v<Out, bf16>)
      if (r.positions != nullptr) return launch_wide<bf16, false, true>(p, r, stream);
    return launch_wide<Out, kGated, false>(p, r, stream);
  }
  if constexpr (!kGated && std::is_same_v<Out, bf16>) {
    if (r.positions != nullptr) {  // the rope epilogue: its own variants, the others keep their registers
      if (p.tokens > 8) return launch_as<gemv_kernel<bf16, false, true, true>>(p, r, stream);
      if (p.tokens <= kDeepMaxTokens) return launch_as<gemv_deep_kernel<bf16, true>>(p, r, stream);
      return launch_as<gemv_kernel<bf16, false, false, true>>(p, r, stream);
    }
  }
  if (p.tokens > 8) {
    launch_as<gemv_kernel<Out, kGated, true>>(p, r, stream);
  } else {
    // The deep kernel up to 4 tokens: at 8 its launches alone are faster too,
    // but 8-sequence decode steps measured 1.4% slower with it.
    if constexpr (!kGated)
      if (p.tokens <= kDeepMaxTokens) return launch_as<gemv_deep_kernel<Out>>(p, r, stream);
    launch_as<gemv_kernel<Out, kGated, false>>(p, r, stream);
  }
}

template <bool kGated>
void launch(const GemvParams& p, bool f32, cudaStream_t stream, const GemvRopeKv& r = {}) {
  if (f32)
    launch_typed<float, kGated>(p, r, stream);
  else
    launch_typed<bf16, kGated>(p, r, stream);
}
}  // namespace

bool gemv_fits(const Tensor& x) { return x.rows <= kMaxTokens && gemv_any_rows_fits(x); }

bool gemv_any_rows_fits(const Tensor& x) {
  return x.dtype == DType::BF16 && x.rows >= 1 && x.rows <= (int64_t(1) << 30) && x.cols >= 8 && x.cols % 8 == 0 &&
         x.cols <= (int64_t(1) << 30) && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

// ys[i] = x @ ws[i]^T; the outputs are all bf16, or a single f32 one.
void gemv(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n, cudaStream_t stream,
          const GemvRopeKv& rope) {
  SERVAL_CHECK(gemv_any_rows_fits(x), "gemv: x [", x.rows, ", ", x.cols, "] does not fit the GEMV kernel");
  const GemvParams p = matmul_segments(x, ws, ys, n, kUnitRows, "gemv");
  if (rope.positions != nullptr) {
    const bool whole_heads = rope.head_dim > 0 && rope.head_dim % kUnitRows == 0 && rope.rope_dim % 2 == 0 &&
                             rope.rope_dim <= rope.head_dim;
    SERVAL_CHECK(n == 3 && ys[0].dtype == DType::BF16 && whole_heads && p.rows[1] == p.rows[2] &&
                     p.rows[0] % rope.head_dim == 0 && p.rows[1] % rope.head_dim == 0,
                 "gemv: rope in the epilogue needs q/k/v outputs of whole heads (head_dim a multiple of 8)");
  }
  if (p.tiles > 0) launch<false>(p, ys[0].dtype == DType::F32, stream, rope);
}

// out = silu(x @ gate^T) * (x @ up^T), bf16; gate and up are [out.cols, x.cols].
void gemv_gated(const Tensor& x, const bf16* gate, const bf16* up, Tensor out, cudaStream_t stream) {
  SERVAL_CHECK(gemv_any_rows_fits(x), "gemv_gated: x [", x.rows, ", ", x.cols, "] does not fit the GEMV kernel");
  const GemvParams p = gated_segments(x, gate, up, out, kUnitRows, "gemv_gated");
  if (p.tiles > 0) launch<true>(p, false, stream);
}

}  // namespace serval::cuda
