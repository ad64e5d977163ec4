// The stacked q/k/v product of 17..64 rows through CUTLASS's decode GEMM
// (cuda_cutlass_kernel.cuh) with rope and the KV write in its epilogue: the
// rotated q goes to q, the rotated k and the v rows straight to the tokens'
// slots of the pools, so the product never goes through memory and no rope
// kernel runs between it and attention.
//
// In the wgmma accumulators a thread holds W rows r and r + 8 of a warp's 16
// (r its lane / 4) for its columns (x rows), so rows 2i and 2i + 1, a rope
// pair of the interleaved style, sit in lanes l and l ^ 4 at the same
// fragment index: one shuffle brings each lane its partner. A 64-row tile lies
// inside one of q, k and v (their widths are multiples of 64), so the
// destination is the same for the whole tile. The pairs are rotated in f32
// before rounding (the rope kernel rotates the product rounded to bf16). The
// angles' cos/sin come from the step's table, computed once for all layers
// (a 64-row tile would otherwise compute about 8 times the rope kernel's
// sincosf, in every layer).
#include "backend/cuda/cuda_cutlass_gemm.h"

#ifdef SERVAL_WITH_CUTLASS

#include "backend/cuda/cuda_cutlass_kernel.cuh"
#include "backend/cuda/cuda_rope.cuh"

namespace serval::cuda {

namespace {

using namespace cutlass_decode;

struct QkvRopeKvOp {
  using Params = CutlassQkvRopeKv;

  static bool can_implement(int m, int n, const Params& p) {
    const int64_t kv_cols = p.kv.row();
    return p.q_cols % 64 == 0 && kv_cols % 64 == 0 && m == p.q_cols + 2 * kv_cols && p.kv.head_dim % 2 == 0 &&
           p.rope_dim % 2 == 0 && p.rope_dim <= p.kv.head_dim && p.q_cols % p.kv.head_dim == 0 && n >= 1;
  }

  // Values i and i + 1 (i even) are one W row at x rows t and t + 1, so each
  // lane loads the cosine and sine for one of the two (the pair's first lane
  // for t, its partner for t + 1) and they swap: one load per lane for two
  // values, not two.
  template <class Acc, class Coords>
  CUTLASS_DEVICE static void apply(const Params& p, const Acc& acc, const Coords& coords, int tokens) {
    const int tile_row = cute::get<0>(coords(0));  // the tile's segment (q, k or v) is the same for every element
    const int kv_cols = int(p.kv.row()), head_dim = p.kv.head_dim;
    const bool is_q = tile_row < p.q_cols, is_v = tile_row >= p.q_cols + kv_cols;
    const int seg_start = is_q ? 0 : is_v ? p.q_cols + kv_cols : p.q_cols;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc); i += 2) {
      const int row = cute::get<0>(coords(i));
      const int t[2] = {cute::get<1>(coords(i)), cute::get<1>(coords(i + 1))};
      const int col = row - seg_start, d = col % head_dim;
      const bool first = (row & 1) == 0;  // the rope pair's first row (a); the partner lane holds b
      const bool rotate = !is_v && d < p.rope_dim;
      float out[2] = {acc(i), acc(i + 1)};
      float sn = 0.0f, cs = 1.0f;
      if (rotate) {
        const int mine = min(first ? t[0] : t[1], tokens - 1);
        const float2 angle = p.angles[mine * (p.rope_dim / 2) + d / 2];
        cs = angle.x;
        sn = angle.y;
      }
      const float sn_x = __shfl_xor_sync(0xffffffffu, sn, 4), cs_x = __shfl_xor_sync(0xffffffffu, cs, 4);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float partner = __shfl_xor_sync(0xffffffffu, out[j], 4);  // row ^ 1, same x row
        const bool own = first == (j == 0);  // this lane computed x row t[j]'s angle
        if (rotate) {
          float ra, rb;
          if (first)
            rope_rotate(out[j], partner, own ? cs : cs_x, own ? sn : sn_x, ra, rb);
          else
            rope_rotate(partner, out[j], own ? cs : cs_x, own ? sn : sn_x, ra, rb);
          out[j] = first ? ra : rb;
        }
      }
      // The pair's first lane stores both rows, as one 4-byte word.
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, out[j], 4);
        if (!first || t[j] >= tokens) continue;
        __nv_bfloat16* dst = is_q ? p.q + int64_t(t[j]) * p.q_cols : p.kv.at(is_v, p.slots[t[j]]);
        *reinterpret_cast<__nv_bfloat162*>(dst + col) = __floats2bfloat162_rn(out[j], other);
      }
    }
  }
};

}  // namespace

bool cutlass_qkv_rope_kv_write(const GemmShape& s, const void* w, const void* x, const CutlassQkvRopeKv& e,
                               const CutlassLaunch& l) {
  return cutlass_decode::launch_with_op<QkvRopeKvOp>(s, w, x, e, l);
}

}  // namespace serval::cuda

#else  // no CUTLASS headers at configure time

namespace serval::cuda {

bool cutlass_qkv_rope_kv_write(const GemmShape&, const void*, const void*, const CutlassQkvRopeKv&,
                               const CutlassLaunch&) {
  return false;
}

}  // namespace serval::cuda

#endif
