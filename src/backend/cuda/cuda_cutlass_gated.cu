// The gate/up product of 17..64 rows through CUTLASS's decode GEMM
// (cuda_cutlass_kernel.cuh) with silu(gate) * up in its epilogue, for a pair
// laid out interleaved (cuda_gate_up_layout.cuh): the [T, 2I] product never
// goes through memory and no silu kernel runs between it and the down
// projection.
//
// A 64-row tile holds 4 groups of 16 pair rows: gate rows 8g..8g+7, then up's
// same rows. A wgmma accumulator thread holds rows r and r + 8 of each 16 at
// fragment values i and i + 2 (RegisterEpilogueOp checks that layout), so
// each thread has gate and up of its outputs without exchanging anything.
// The outputs need an even count per row (4-byte stores): I is a multiple
// of 32 wherever the pair's 2I rows are whole tiles of 64.
//
// At 33-64 rows (swapped_rows) the product runs on the swapped kernel (x rows
// as wgmma's M) in W tiles of 64 or 96 pair rows, whichever fills the SMs'
// waves best (7B: 96; 8B: 64), unless CutlassLaunch::swap_gated is off (W
// as A there). (Tiles of 176, one wave, lost.)
#include "backend/cuda/cuda_cutlass_gemm.h"

#ifdef SERVAL_WITH_CUTLASS

#include "backend/cuda/cuda_cutlass_kernel.cuh"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "backend/cuda/cuda_waves.h"

namespace serval::cuda {

namespace {

using namespace cutlass_decode;

struct SiluMulOp {
  struct Params {
    __nv_bfloat16* out;  // [tokens, outputs]
    int outputs;         // I: half the pair's rows
  };

  static bool can_implement(int m, int n, const Params& p) { return m == 2 * p.outputs && m % 64 == 0 && n >= 1; }

  template <class Acc, class Coords>
  CUTLASS_DEVICE static void apply(const Params& p, const Acc& acc, const Coords& coords, int tokens) {
    static_assert(kGateUpGroupRows == 8, "gate row r and up row r + 8 are fragment values i and i + 2");
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc); ++i) {
      if (i % 4 >= 2) continue;  // values i + 2: the up rows, read with their gate rows
      const int row = cute::get<0>(coords(i)), t = cute::get<1>(coords(i));
      const float g = acc(i), u = acc(i + 2);
      const float h = g / (1.0f + __expf(-g)) * u;
      // Lanes l and l ^ 4 hold rows r and r ^ 1 (outputs c and c ^ 1): the
      // even one stores both, as one 4-byte word.
      const float other = __shfl_xor_sync(0xffffffffu, h, 4);
      if ((row & 1) != 0 || t >= tokens) continue;
      const int out_col = row / 16 * 8 + row % 8;
      *reinterpret_cast<__nv_bfloat162*>(p.out + int64_t(t) * p.outputs + out_col) = __floats2bfloat162_rn(h, other);
    }
  }
};

// The same for the swapped kernel, whose coordinates are (x row, W row): a
// thread holds pair rows c and c + 1 (c even) at values i and i + 1, and the
// rows 8 on at i + 4 (RegisterEpilogueOp checks it): gate's rows of a group
// of 16 at values i with i % 8 < 4, up's at i + 4. Outputs c and c + 1 are
// adjacent, one 4-byte store, with no exchange between lanes.
struct SwappedSiluMulOp {
  static constexpr bool kSwapped = true;
  using Params = SiluMulOp::Params;

  // The unswapped op's shapes, so the same products fuse wherever x's rows go.
  static bool can_implement(int m, int n, const Params& p) { return SiluMulOp::can_implement(m, n, p); }

  template <class Acc, class Coords>
  CUTLASS_DEVICE static void apply(const Params& p, const Acc& acc, const Coords& coords, int tokens) {
    static_assert(kGateUpGroupRows == 8, "gate row r and up row r + 8 are fragment values i and i + 4");
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc); i += 2) {
      if (i % 8 >= 4) continue;  // values i + 4: the up rows, read with their gate rows
      const int t = cute::get<0>(coords(i)), row = cute::get<1>(coords(i));
      // Rows past the pair: the last W tile's zeros where 96 does not divide 2I.
      if (t >= tokens || row >= 2 * p.outputs) continue;
      const float g0 = acc(i), u0 = acc(i + 4), g1 = acc(i + 1), u1 = acc(i + 5);
      const float h0 = g0 / (1.0f + __expf(-g0)) * u0, h1 = g1 / (1.0f + __expf(-g1)) * u1;
      const int out_col = row / 16 * 8 + row % 8;
      *reinterpret_cast<__nv_bfloat162*>(p.out + int64_t(t) * p.outputs + out_col) = __floats2bfloat162_rn(h0, h1);
    }
  }
};

template <int kWRows>
bool swapped_silu_mul(const GemmShape& s, const void* w, const void* x, const SiluMulOp::Params& p,
                      const CutlassLaunch& l) {
  return SwappedDecodeKernel<kWRows, RegisterEpilogue<SwappedSiluMulOp>>::launch(s, w, x, p, l);
}

}  // namespace

bool cutlass_silu_mul(const GemmShape& s, const void* w, const void* x, __nv_bfloat16* out, const CutlassLaunch& l) {
  if (s.m % 2 != 0) return false;
  const SiluMulOp::Params p{out, int(s.m / 2)};
  if (l.swap_gated && swapped_rows(s.n, l) && s.batch == 1 && !s.y_f32) {
    return best_w_tile(s.m, 1, l.sms, {64, 96}) == 96 ? swapped_silu_mul<96>(s, w, x, p, l)
                                                      : swapped_silu_mul<64>(s, w, x, p, l);
  }
  return launch_with_op<SiluMulOp>(s, w, x, p, l);
}

}  // namespace serval::cuda

#else  // no CUTLASS headers at configure time

namespace serval::cuda {

bool cutlass_silu_mul(const GemmShape&, const void*, const void*, __nv_bfloat16*, const CutlassLaunch&) {
  return false;
}

}  // namespace serval::cuda

#endif
