#pragma once
// What the CUTLASS decode GEMMs share (cuda_cutlass_gemm.cu, the plain
// product; cuda_cutlass_qkv_rope.cu, the q/k/v product with rope and the KV
// write in its epilogue; cuda_cutlass_gated.cu, gate/up with silu * up in
// its epilogue): the mainloop (TMA loads by a producer warp, wgmma by
// one consumer warpgroup, a tile of 64 W rows x 128 of k x kRowsOfX rows of x,
// as many pipeline stages as shared memory holds beside the epilogue's, W's
// first k blocks asked of L2 early: PrefetchingMainloop), and the launch as a
// programmatic dependent. Only for .cu files compiled with CUTLASS's headers
// (SERVAL_WITH_CUTLASS).
//
// W is M x K row-major, x is N x K row-major (k contiguous in both: the "TN"
// GEMM): in CUTLASS's terms A = W, B = x^T (column-major), and the output is
// D = y^T (column-major, y N x M row-major); SwappedDecodeKernel takes them
// the other way round (A = x, B = W^T, D = y). The kernel waits
// (griddepcontrol.wait, with CUTLASS_ENABLE_GDC_FOR_SM90) before its first
// load and stores only after it.
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_launch.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_cutlass_gemm.h"

namespace serval::cuda::cutlass_decode {

using Bf16 = cutlass::bfloat16_t;
// 64 rows of A x kN rows of B x 128 of k: W rows, x rows, k (DecodeKernel);
// x rows, W rows, k (SwappedDecodeKernel).
template <int kN>
using Tile = cute::Shape<cute::_64, cute::Int<kN>, cute::_128>;
using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
using LayoutY = cutlass::layout::ColumnMajor;

// CUTLASS's mainloop `Base` with an L2 prefetch of the first
// Arguments::prefetch_k_blocks k blocks of the CTA's W rows
// (CutlassLaunch::w_prefetch_k_blocks) in load_init, which the kernel calls
// in every thread before it waits for the kernel before it
// (griddepcontrol.wait): a CTA made resident early (the norm kernels let the
// next kernel in at once, a product once its mainloop is done) streams
// weights while DRAM would idle in that kernel's end. One warp issues it, a
// bulk L2 prefetch a row. kWIsB: W is the product's B (SwappedDecodeKernel),
// its rows the N tiles (blockIdx.y); else its A (blockIdx.x). The batch
// (split k) is blockIdx.z.
template <class Base, bool kWIsB>
struct PrefetchingMainloop : Base {
  struct Arguments : Base::Arguments {
    int prefetch_k_blocks = 0;
  };
  struct Params : Base::Params {
    const Bf16* w = nullptr;
    int64_t ld = 0, stride_l = 0;
    int prefetch_k = 0;  // elements of k per row
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    Params p{Base::to_underlying_arguments(shape, args, workspace)};
    const auto& stride = kWIsB ? args.dB : args.dA;
    p.w = kWIsB ? args.ptr_B : args.ptr_A;
    p.ld = cute::get<0>(stride);
    p.stride_l = cute::get<2>(stride);
    p.prefetch_k = args.prefetch_k_blocks * int(cute::size<2>(typename Base::TileShape{}));
    return p;
  }

  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& p) const {
    if (p.prefetch_k > 0 && threadIdx.x < 32) {
      constexpr int kRows = int(cute::size<kWIsB ? 1 : 0>(typename Base::TileShape{}));
      const int rows = int(cute::get<kWIsB ? 1 : 0>(shape)), k = int(cute::get<2>(shape));
      const int first = int(kWIsB ? blockIdx.y : blockIdx.x) * kRows;
      const uint32_t bytes = uint32_t(min(p.prefetch_k, k)) * 2u;  // k a multiple of 8: 16-byte multiples
      const Bf16* base = p.w + int64_t(blockIdx.z) * p.stride_l;
      const int end = min(first + kRows, rows);
      for (int r = first + int(threadIdx.x); r < end; r += 32)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + int64_t(r) * p.ld), "r"(bytes)
                     : "memory");
    }
    return Base::load_init(shape, p);
  }
};

// The mainloop both kernels run: A row-major and B column-major (k
// contiguous in both), tiles of TileShape, as many stages as shared memory
// holds beside kCarveout bytes; W is B where kWIsB.
template <class TileShape, int kCarveout, bool kWIsB>
using DecodeMainloop = PrefetchingMainloop<
    typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::RowMajor, 8, Bf16,
        cutlass::layout::ColumnMajor, 8, float, TileShape, Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<kCarveout>,
        cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp,
    kWIsB>;

// An operand's (row, k, batch) stride for `s`: rows ld() apart, batches
// `batch_stride` apart.
template <class Stride>
Stride operand_stride(const GemmShape& s, int64_t batch_stride) {
  Stride st{};
  cute::get<0>(st) = s.ld();
  cute::get<2>(st) = batch_stride;
  return st;
}

// Shared memory an SM gives each of k CTAs (228 KB, 1 KB of it reserved per CTA).
constexpr int smem_per_cta(int k) { return 233472 / k - 1024; }

// Launches CUTLASS's `Kernel` with `args` on l.stream (a programmatic
// dependent where l.pdl), kCtasPerSm CTAs per SM; false, having launched
// nothing, where it cannot take them.
template <class Kernel, int kCtasPerSm = 1>
bool launch_kernel(const typename Kernel::Arguments& args, const CutlassLaunch& l) {
  // No workspace (no split-K of its own: no memset node between it and the
  // kernel before).
  if (!Kernel::can_implement(args) || Kernel::get_workspace_size(args) != 0) return false;
  // The shared-memory size once per kernel and device, not at every launch
  // (prefill and eager steps launch outside graphs).
  static PerDevice<bool> configured;
  int dev = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  configured.get(dev, [] {
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(Kernel::SharedStorageSize)));
    if (kCtasPerSm > 1)  // all of the SM's memory as shared, for the CTAs' stages
      SERVAL_CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                             cudaFuncAttributePreferredSharedMemoryCarveout,
                                             int(cudaSharedmemCarveoutMaxShared)));
    return true;
  });
  const typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
  return cutlass::kernel_launch<Kernel>(Kernel::get_grid_shape(params), Kernel::get_block_shape(),
                                        Kernel::SharedStorageSize, l.stream, params,
                                        /*launch_with_pdl=*/l.pdl) == cutlass::Status::kSuccess;
}

// The kernel of tile kRowsOfX with the collective epilogue `Epilogue`, as
// many stages as shared memory holds for kCtasPerSm CTAs per SM.
template <int kRowsOfX, class Epilogue, int kCtasPerSm = 1>
struct DecodeKernel {
  // What the stages must leave of the 227 KB one CTA may have: the epilogue's storage, and with
  // more CTAs per SM the others' share plus 1 KB for the pipeline's barriers.
  static constexpr int kCarveout =
      int(sizeof(typename Epilogue::SharedStorage)) + (kCtasPerSm == 1 ? 0 : 232448 - smem_per_cta(kCtasPerSm) + 1024);
  using Mainloop = DecodeMainloop<Tile<kRowsOfX>, kCarveout, /*kWIsB=*/false>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  static_assert(kCtasPerSm == 1 || int(Kernel::SharedStorageSize) <= smem_per_cta(kCtasPerSm),
                "the stages must leave room for kCtasPerSm CTAs per SM");

  // The mainloop's arguments for `s` (strides of W and x, their L mode the batch).
  static typename Mainloop::Arguments mainloop_args(const GemmShape& s, const void* w, const void* x,
                                                    const CutlassLaunch& l) {
    return {{static_cast<const Bf16*>(w), operand_stride<typename Kernel::StrideA>(s, s.stride_w),
             static_cast<const Bf16*>(x), operand_stride<typename Kernel::StrideB>(s, s.stride_x)},
            l.w_prefetch_k_blocks};
  }

  // Launches the product of `s` with epilogue arguments `epi`; false, having
  // launched nothing, where the kernel cannot take the operands.
  static bool launch(const GemmShape& s, const void* w, const void* x, const typename Epilogue::Arguments& epi,
                     const CutlassLaunch& l) {
    return launch_kernel<Kernel, kCtasPerSm>({cutlass::gemm::GemmUniversalMode::kGemm,
                                              {int(s.m), int(s.n), int(s.k), int(s.batch)},
                                              mainloop_args(s, w, x, l),
                                              epi},
                                             l);
  }
};

// The same kernel with the operands' roles swapped: x is CUTLASS's A (the
// tile's 64 rows, wgmma's M), W is B in tiles of kWRows rows (wgmma's N, any
// multiple of 16 up to 256), so the W tile can take the width whose tile
// count fills the SMs' last wave best (q/k/v's 12288 rows: 128 tiles of 96
// where tiles of 64 take 1.45 waves). The output D is y itself (x rows by W
// rows, row-major).
template <int kWRows, class Epilogue>
struct SwappedDecodeKernel {
  using Mainloop = DecodeMainloop<Tile<kWRows>, int(sizeof(typename Epilogue::SharedStorage)), /*kWIsB=*/true>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;

  static bool launch(const GemmShape& s, const void* w, const void* x, const typename Epilogue::Arguments& epi,
                     const CutlassLaunch& l) {
    return launch_kernel<Kernel>({cutlass::gemm::GemmUniversalMode::kGemm,
                                  {int(s.n), int(s.m), int(s.k), int(s.batch)},
                                  {{static_cast<const Bf16*>(x),
                                    operand_stride<typename Kernel::StrideA>(s, s.stride_x),
                                    static_cast<const Bf16*>(w),
                                    operand_stride<typename Kernel::StrideB>(s, s.stride_w)},
                                   l.w_prefetch_k_blocks},
                                  epi},
                                 l);
  }
};

// Whether products of `rows` of x take the swapped kernel: at 33-64 rows
// (the tile's 64 rows of x as wgmma's M; rows past x's are TMA's zeros, not
// read), unless l.swap is off.
inline bool swapped_rows(int64_t rows, const CutlassLaunch& l) { return l.swap && rows >= 33 && rows <= 64; }

// Whether a TiledMma's accumulators (its (thread, value) -> W row + 64 x row
// of x layout) are wgmma's for one warpgroup as the register epilogues' ops
// rely on: thread (lane % 4, lane / 4, warp) starts at x row 2 (lane % 4) and
// W row lane / 4 + 16 warp; value (x row + 1, W row + 8, then more x rows).
// So lanes l and l ^ 4 hold W rows 2i and 2i + 1 at the same value, and
// values v and v + 2 (v % 4 < 2) W rows r and r + 8 of one thread.
// In the swapped kernel (W rows as N) the ops also rely on value v + 4 being
// 8 W rows on from v (kSwapped).
template <class TV, bool kSwapped = false>
constexpr bool wgmma_accumulators() {
  using namespace cute;
  constexpr bool base = std::is_same_v<decltype(layout<0>(TV{})), Layout<Shape<_4, _8, _4>, Stride<_128, _1, _16>>> &&
                        size<1, 0, 0>(TV{}) == 2 && size<1, 0, 1>(TV{}) == 2 && stride<1, 0, 0>(TV{}) == 64 &&
                        stride<1, 0, 1>(TV{}) == 8;
  if constexpr (kSwapped)
    return base && stride<1, 0, 2>(TV{}) == 512;
  else
    return base;
}

// Whether a register epilogue's Op is for the swapped kernel (its
// `kSwapped`): its coordinates are then (x row, W row), and its product's
// first mode the tokens.
template <class Op>
constexpr bool swapped_op() {
  if constexpr (requires { Op::kSwapped; })
    return Op::kSwapped;
  else
    return false;
}

// An epilogue that works on the accumulators in registers (no shared memory,
// no TMA store): `Op::apply` gets the consumer warpgroup's fragment with
// each element's (W row, x row) in the whole product. For products whose
// outputs need more than one element each (a rope pair, gate and up).
// `Op::Params` are its arguments. Wrapped for the warp-specialized kernel by
// CUTLASS's adapter, as its own register epilogue is.
template <class Op>
class RegisterEpilogueOp {
  static constexpr bool kSwapped = swapped_op<Op>();

 public:
  using EpilogueSchedule = cutlass::epilogue::NoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementC = void;
  using ElementD = Bf16;
  using StrideC = cute::Stride<cute::_1, int64_t, int64_t>;
  using StrideD = StrideC;
  using ThreadEpilogueOp = void;
  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  using Arguments = typename Op::Params;
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, Arguments const& args) {  // (W rows, tokens)
    return Op::can_implement(cute::get<kSwapped ? 1 : 0>(shape), cute::get<kSwapped ? 0 : 1>(shape), args);
  }

  CUTLASS_HOST_DEVICE RegisterEpilogueOp(Params const& params, SharedStorage const& = SharedStorage())
      : params_(params) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    const auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    (void)k_coord;
    (void)l_coord;
    // Each accumulator's (W row, x row) in the whole product.
    Tensor coords = local_tile(make_identity_tensor(make_shape(get<0>(problem_shape_mnkl), get<1>(problem_shape_mnkl))),
                               take<0, 2>(blk_shape_mnk), make_coord(m_coord, n_coord));
    Tensor thread_coords = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    static_assert(is_static<FrgLayout>::value, "the accumulator layout must be static");
    static_assert(wgmma_accumulators<decltype(tiled_mma.get_layoutC_TV()), kSwapped>(),
                  "the ops rely on wgmma's accumulator layout (wgmma_accumulators)");
    Op::apply(params_, accumulators, thread_coords, int(get<kSwapped ? 0 : 1>(problem_shape_mnkl)));
  }

 private:
  Params params_;
};

// Launches the kernel of tile kRowsOfX (DecodeKernel::launch). The 32-row
// tile (17..32 rows) runs two CTAs per SM where l.two_ctas, each with the
// stages of half an SM (4 instead of 9 with the register epilogues; 42
// registers a thread): q/k/v's 192 tiles and gate/up's 344 take fewer
// waves, and one CTA's epilogue runs beside the other's mainloop. (The
// 64-row tile lost that way: 3 stages instead of 6-7.)
template <int kRowsOfX, class Epilogue>
bool launch_tile(const GemmShape& s, const void* w, const void* x, const typename Epilogue::Arguments& epi,
                 const CutlassLaunch& l) {
  if constexpr (kRowsOfX == 32)
    if (l.two_ctas) return DecodeKernel<32, Epilogue, 2>::launch(s, w, x, epi, l);
  return DecodeKernel<kRowsOfX, Epilogue>::launch(s, w, x, epi, l);
}

template <class Op>
using RegisterEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<RegisterEpilogueOp<Op>>;

// The product of `s` (one batch, bf16 output kept in registers) finished by
// `Op`, on the tile of x rows that the plain GEMM would take (cutlass_gemm);
// false, having launched nothing, where none takes it.
template <class Op>
bool launch_with_op(const GemmShape& s, const void* w, const void* x, const typename Op::Params& p,
                    const CutlassLaunch& l) {
  if (s.n < 1 || s.n > kCutlassMaxRows || s.batch != 1 || s.y_f32) return false;
  if (s.n <= 32) return launch_tile<32, RegisterEpilogue<Op>>(s, w, x, p, l);
  if (s.n < 48) return launch_tile<48, RegisterEpilogue<Op>>(s, w, x, p, l);
  return launch_tile<64, RegisterEpilogue<Op>>(s, w, x, p, l);
}

}  // namespace serval::cuda::cutlass_decode
