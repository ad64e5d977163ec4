// The GEMV for any number of rows, for batch-invariant mode: the rows in
// groups of 16, each through the GEMV's own unit (cuda_gemv_unit.cuh).
#include <algorithm>

#include "backend/cuda/cuda_gemv_unit.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda::gemv_unit {

namespace {

// Any number of rows, for batch-invariant mode (CudaBackend's
// set_batch_invariant): the rows come in groups of 16, and each group goes
// through the GEMV's own units, k-steps, mma chain and sums (the same
// registers feed the same mmas in the same order), so every row gets the bits
// it gets from the GEMV alone, in a batch of any size. A block takes kUnits
// consecutive units (blockIdx.y) for up to kWideGroups groups (blockIdx.x):
// each lane streams its rows of every unit through a ring of kWideSlots
// k-steps, and each x load (an L1 or L2 hit, one step ahead) feeds the mmas of
// all kUnits units. The groups' blocks of the same units are neighbours in
// the grid, so they share W through L2. (Slower per row than the GEMV,
// whose x loads ride in its 8-slot ring: here they wait one step ahead.)
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

}  // namespace

// More than kMaxTokens rows: gemv_wide_kernel, one block per (groups, units).
// The most units per block (fewest x loads per W byte) that leave at least
// two blocks per SM; any count gives the same bits.
template <typename Out, bool kGated, bool kRope>
void launch_wide(const GemvParams& p, const GemvRopeKv& r, const Launch& on) {
  const int sms = device_sms(on);
  const int group_blocks = ceil_div(p.tokens, kWideGroups * 16);
  auto blocks = [&](int units) { return int64_t(ceil_div(p.tiles, units)) * group_blocks; };
  const int units = !kGated && blocks(4) >= 2 * sms ? 4 : blocks(2) >= 2 * sms ? 2 : 1;
  SERVAL_CHECK(ceil_div(p.tiles, units) <= 65535, "gemv: ", p.tiles, " units of ", kUnitRows,
               " rows are more than a grid holds");
  const dim3 grid(unsigned(group_blocks), unsigned(ceil_div(p.tiles, units)));
  auto go = [&](auto kernel) { launch_pdl(kernel, grid, dim3(kThreads), 0, on, p, r); };
  if (units == 4) {
    if constexpr (!kGated) go(gemv_wide_kernel<Out, kGated, 4, kRope>);
  } else if (units == 2) {
    go(gemv_wide_kernel<Out, kGated, 2, kRope>);
  } else {
    go(gemv_wide_kernel<Out, kGated, 1, kRope>);
  }
}

template void launch_wide<bf16, false, true>(const GemvParams&, const GemvRopeKv&, const Launch&);
template void launch_wide<bf16, false, false>(const GemvParams&, const GemvRopeKv&, const Launch&);
template void launch_wide<float, false, false>(const GemvParams&, const GemvRopeKv&, const Launch&);
template void launch_wide<bf16, true, false>(const GemvParams&, const GemvRopeKv&, const Launch&);
template void launch_wide<float, true, false>(const GemvParams&, const GemvRopeKv&, const Launch&);

}  // namespace serval::cuda::gemv_unit
