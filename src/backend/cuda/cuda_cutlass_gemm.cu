// Decode products of 17..64 rows through CUTLASS's Hopper GEMM: TMA loads by a
// producer warp, wgmma by one consumer warpgroup, a tile of 64 W rows x 128 of
// k x the batch's rows of x (a tile of 64 of them; of 32 up to 32 rows, where
// the 64-row tile was 2.5-5% slower than cuBLASLt on an H100 and the 32-row
// one 4.5-5% faster; of 48 at 33..47 rows, which by default stay on cuBLASLt
// and have not run on a GPU), and as many pipeline stages as shared memory holds.
//
// Why not cuBLASLt for them: its kernels cannot be programmatic dependents
// (they do not wait on the kernel before them), so every product pays a
// launch gap after the small kernel before it. CUTLASS's kernels wait
// (griddepcontrol.wait, with CUTLASS_ENABLE_GDC_FOR_SM90) before their first
// load, and store only after it, so they are launched with programmatic
// stream serialization like our own kernels.
//
// W is M x K row-major, x is N x K row-major (k contiguous in both: the "TN"
// GEMM), y is N x M row-major: in CUTLASS's terms A = W, B = x^T
// (column-major), D = y^T (column-major). A strided batch (GemmShape's batch
// and strides, also how matmul_add_rmsnorm splits k in two) is CUTLASS's L
// mode. Without CUTLASS's headers this file builds the stub at its end.
#include "backend/cuda/cuda_cutlass_gemm.h"

#ifdef SERVAL_WITH_CUTLASS

#include "backend/cuda/cuda_common.cuh"

#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace serval::cuda {

namespace {

using namespace cute;

template <class ElementY, int kRowsOfX>
struct DecodeGemm {
  using Bf16 = cutlass::bfloat16_t;
  using Tile = Shape<_64, Int<kRowsOfX>, _128>;  // W rows, x rows, k
  using Cluster = Shape<_1, _1, _1>;
  using LayoutW = cutlass::layout::RowMajor;
  using LayoutX = cutlass::layout::ColumnMajor;
  using LayoutY = cutlass::layout::ColumnMajor;
  static constexpr int kAlignY = 16 / int(sizeof(ElementY));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutY, kAlignY, ElementY, LayoutY,
      kAlignY, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutW, 8, Bf16, LayoutX, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static bool run(const GemmShape& s, const void* w, const void* x, void* y, cudaStream_t stream) {
    typename Kernel::StrideA sw{};  // (m, k, batch)
    get<0>(sw) = s.ld();
    get<2>(sw) = s.stride_w;
    typename Kernel::StrideB sx{};  // (n, k, batch)
    get<0>(sx) = s.ld();
    get<2>(sx) = s.stride_x;
    typename Kernel::StrideD sy{};  // (m, n, batch)
    get<1>(sy) = s.m;
    get<2>(sy) = s.stride_y;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {int(s.m), int(s.n), int(s.k), int(s.batch)},
                                  {static_cast<const Bf16*>(w), sw, static_cast<const Bf16*>(x), sx},
                                  {{1.0f, 0.0f}, nullptr, sy, static_cast<ElementY*>(y), sy}};
    // The kernel needs no workspace (no split-K of its own: no memset node
    // between it and the kernel before).
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess || Gemm::get_workspace_size(args) != 0) return false;
    // Its shared-memory size once per kernel, not at every launch as
    // GemmUniversalAdapter::initialize would (prefill and eager steps launch
    // outside graphs).
    static const bool configured = [] {
      SERVAL_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(Kernel::SharedStorageSize)));
      return true;
    }();
    (void)configured;
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
    return Gemm::run(params, stream, nullptr, /*launch_with_pdl=*/true) == cutlass::Status::kSuccess;
  }
};

}  // namespace

bool cutlass_gemm_built() { return true; }

bool cutlass_gemm(const GemmShape& s, const void* w, const void* x, void* y, cudaStream_t stream) {
  if (s.n < 1 || s.n > kCutlassMaxRows) return false;
  if (s.n <= 32)
    return s.y_f32 ? DecodeGemm<float, 32>::run(s, w, x, y, stream)
                   : DecodeGemm<cutlass::bfloat16_t, 32>::run(s, w, x, y, stream);
  if (s.n < 48)
    return s.y_f32 ? DecodeGemm<float, 48>::run(s, w, x, y, stream)
                   : DecodeGemm<cutlass::bfloat16_t, 48>::run(s, w, x, y, stream);
  return s.y_f32 ? DecodeGemm<float, 64>::run(s, w, x, y, stream)
                 : DecodeGemm<cutlass::bfloat16_t, 64>::run(s, w, x, y, stream);
}

}  // namespace serval::cuda

#else  // no CUTLASS headers at configure time

namespace serval::cuda {

bool cutlass_gemm_built() { return false; }
bool cutlass_gemm(const GemmShape&, const void*, const void*, void*, cudaStream_t) { return false; }

}  // namespace serval::cuda

#endif
