// Decode products of 17..64 rows through CUTLASS's Hopper GEMM
// (cuda_cutlass_kernel.cuh), its TMA epilogue storing y as computed: a tile
// of 32 rows of x up to 32 rows (where the 64-row tile lost to cuBLASLt), of
// 48 at 33..47 rows and of 64 above. At 33..64 rows the swapped kernel takes
// them instead (x as A, W as B in W tiles that fill the SMs' waves), unless
// CutlassLaunch::swap is off.
//
// Why not cuBLASLt for them: its kernels cannot be programmatic dependents
// (they do not wait on the kernel before them), so every product pays a
// launch gap after the small kernel before it. CUTLASS's kernels wait before
// their first load, so they are launched like our own kernels.
//
// A strided batch (GemmShape's batch and strides, also how
// matmul_add_rmsnorm splits k in two) is CUTLASS's L mode. Without CUTLASS's
// headers this file builds the stub at its end.
#include "backend/cuda/cuda_cutlass_gemm.h"

#include <algorithm>

#ifdef SERVAL_WITH_CUTLASS

#include "backend/cuda/cuda_cutlass_kernel.cuh"
#include "backend/cuda/cuda_waves.h"

namespace serval::cuda {

namespace {

using namespace cutlass_decode;

// CUTLASS's TMA epilogue for tile shape TileShape: y (bf16 or f32) stored as
// computed, in layout LayoutD.
template <class ElementY, class TileShape, class LayoutD>
using TmaEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, 16 / int(sizeof(ElementY)),
    ElementY, LayoutD, 16 / int(sizeof(ElementY)), cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;

// The kernel of tile kRowsOfX with it, y^T column-major as its D.
template <class ElementY, int kRowsOfX>
struct DecodeGemm {
  using Epilogue = TmaEpilogue<ElementY, Tile<kRowsOfX>, LayoutY>;

  static bool run(const GemmShape& s, const void* w, const void* x, void* y, const CutlassLaunch& l) {
    typename Epilogue::StrideD sy{};  // (m, n, batch)
    cute::get<1>(sy) = s.m;
    cute::get<2>(sy) = s.stride_y;
    return launch_tile<kRowsOfX, Epilogue>(s, w, x, {{1.0f, 0.0f}, nullptr, sy, static_cast<ElementY*>(y), sy}, l);
  }
};

// The swapped kernel (SwappedDecodeKernel) with it, y row-major as its D, W
// tiles of kWRows.
template <class ElementY, int kWRows>
struct SwappedGemm {
  using Epilogue = TmaEpilogue<ElementY, Tile<kWRows>, cutlass::layout::RowMajor>;

  static bool run(const GemmShape& s, const void* w, const void* x, void* y, const CutlassLaunch& l) {
    typename Epilogue::StrideD sy{};  // (x row, W row, batch)
    cute::get<0>(sy) = s.m;
    cute::get<2>(sy) = s.stride_y;
    return SwappedDecodeKernel<kWRows, Epilogue>::launch(
        s, w, x, {{1.0f, 0.0f}, nullptr, sy, static_cast<ElementY*>(y), sy}, l);
  }
};

// bf16 products take W tiles of 48, 64 or 96 rows, whichever fills the waves
// best (7B q/k/v: 96; 8B q/k/v: 48; o and down, split in two: 64); f32 ones
// (split halves, logits) 64.
bool swapped_gemm(const GemmShape& s, const void* w, const void* x, void* y, const CutlassLaunch& l) {
  using cutlass::bfloat16_t;
  if (s.y_f32) return SwappedGemm<float, 64>::run(s, w, x, y, l);
  switch (best_w_tile(s.m, s.batch, l.sms, {64, 96, 48})) {
    case 96: return SwappedGemm<bfloat16_t, 96>::run(s, w, x, y, l);
    case 48: return SwappedGemm<bfloat16_t, 48>::run(s, w, x, y, l);
    default: return SwappedGemm<bfloat16_t, 64>::run(s, w, x, y, l);
  }
}

}  // namespace

bool cutlass_gemm_built() { return true; }

bool cutlass_gemm(const GemmShape& s, const void* w, const void* x, void* y, const CutlassLaunch& l) {
  if (s.n < 1 || s.n > kCutlassMaxRows) return false;
  if (swapped_rows(s.n, l)) return swapped_gemm(s, w, x, y, l);
  using cutlass::bfloat16_t;
  if (s.n <= 32)
    return s.y_f32 ? DecodeGemm<float, 32>::run(s, w, x, y, l) : DecodeGemm<bfloat16_t, 32>::run(s, w, x, y, l);
  if (s.n < 48)
    return s.y_f32 ? DecodeGemm<float, 48>::run(s, w, x, y, l) : DecodeGemm<bfloat16_t, 48>::run(s, w, x, y, l);
  return s.y_f32 ? DecodeGemm<float, 64>::run(s, w, x, y, l) : DecodeGemm<bfloat16_t, 64>::run(s, w, x, y, l);
}

}  // namespace serval::cuda

#else  // no CUTLASS headers at configure time

namespace serval::cuda {

bool cutlass_gemm_built() { return false; }
bool cutlass_gemm(const GemmShape&, const void*, const void*, void*, const CutlassLaunch&) { return false; }

}  // namespace serval::cuda

#endif
