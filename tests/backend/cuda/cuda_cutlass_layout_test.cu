// What the CUTLASS decode GEMM's register epilogues rely on
// (cuda_cutlass_kernel.cuh), worked out on the host from the kernels' own
// TiledMma, partitioned exactly as the epilogue partitions it: for tiles of
// 32, 48 and 64 rows of x, every accumulator is held once; the W row 2i + 1
// beside row 2i (a rope pair) is held by lane ^ 4 at the same fragment index
// (cuda_cutlass_qkv_rope.cu shuffles it over); row r + 8 of row r < 8 (mod 16)
// by the same thread at index i + 2 (cuda_cutlass_gated.cu reads gate and up
// there). Needs no GPU.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "backend/cuda/cuda_cutlass_kernel.cuh"

namespace serval::cuda::cutlass_decode {

// An epilogue op that does nothing: only the kernel's TiledMma is looked at.
struct LayoutTestNoOp {
  struct Params {};
  static bool can_implement(int, int, const Params&) { return true; }
  template <class Acc, class Coords>
  CUTLASS_DEVICE static void apply(const Params&, const Acc&, const Coords&, int) {}
};

namespace {

template <int kRowsOfX>
void expect_epilogue_layout() {
  using TiledMma = typename DecodeKernel<kRowsOfX, RegisterEpilogue<LayoutTestNoOp>>::Mainloop::TiledMma;
  TiledMma mma;
  const auto tile = cute::make_identity_tensor(cute::make_shape(cute::Int<64>{}, cute::Int<kRowsOfX>{}));
  std::map<std::pair<int, int>, std::pair<int, int>> holder;  // (W row, x row) -> (thread, index)
  for (int thread = 0; thread < 128; ++thread) {
    const auto coords = mma.get_thread_slice(thread).partition_C(tile);
    for (int i = 0; i < int(cute::size(coords)); ++i) {
      const std::pair<int, int> at{int(cute::get<0>(coords(i))), int(cute::get<1>(coords(i)))};
      EXPECT_EQ(holder.count(at), 0u) << "row " << at.first << ", x row " << at.second << " held twice";
      holder[at] = {thread, i};
    }
  }
  ASSERT_EQ(holder.size(), size_t(64 * kRowsOfX));
  int pairs_apart = 0, gate_up_apart = 0;
  for (const auto& [at, by] : holder) {
    const auto [row, x_row] = at;
    const auto [thread, i] = by;
    const auto partner = holder.at({row ^ 1, x_row});
    pairs_apart += partner.first != (thread ^ 4) || partner.second != i;
    if (row % 16 < 8) {
      const auto up = holder.at({row + 8, x_row});
      gate_up_apart += up.first != thread || up.second != i + 2 || i % 4 >= 2;
    }
  }
  EXPECT_EQ(pairs_apart, 0) << "tile of " << kRowsOfX << " rows of x";
  EXPECT_EQ(gate_up_apart, 0) << "tile of " << kRowsOfX << " rows of x";
}

TEST(CudaCutlassLayout, RopePairsAndGateUpRowsMeetWhereTheEpiloguesLook) {
  expect_epilogue_layout<32>();
  expect_epilogue_layout<48>();
  expect_epilogue_layout<64>();
}

}  // namespace
}  // namespace serval::cuda::cutlass_decode
