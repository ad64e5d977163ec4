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
#include "backend/cuda/cuda_cutlass_gemm.h"

#ifdef SERVAL_WITH_CUTLASS

#include "backend/cuda/cuda_cutlass_kernel.cuh"
#include "backend/cuda/cuda_gate_up_layout.cuh"

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

}  // namespace

bool cutlass_silu_mul(const GemmShape& s, const void* w, const void* x, __nv_bfloat16* out, cudaStream_t stream) {
  return s.m % 2 == 0 && cutlass_decode::launch_with_op<SiluMulOp>(s, w, x, {out, int(s.m / 2)}, stream);
}

}  // namespace serval::cuda

#else  // no CUTLASS headers at configure time

namespace serval::cuda {

bool cutlass_silu_mul(const GemmShape&, const void*, const void*, __nv_bfloat16*, cudaStream_t) { return false; }

}  // namespace serval::cuda

#endif
