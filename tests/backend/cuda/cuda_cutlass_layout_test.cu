// What the CUTLASS decode GEMM's register epilogues rely on
// (cuda_cutlass_kernel.cuh), worked out on the host from the kernels' own
// TiledMma, partitioned exactly as the epilogue partitions it: for tiles of
// 32, 48 and 64 rows of x, every accumulator is held once; the W row 2i + 1
// beside row 2i (a rope pair) is held by lane ^ 4 at the same fragment index
// (cuda_cutlass_qkv_rope.cu shuffles it over); row r + 8 of row r < 8 (mod 16)
// by the same thread at index i + 2 (cuda_cutlass_gated.cu reads gate and up
// there); and the swapped kernel's, for its W tiles of 64 and 96 rows. Needs
// no GPU.
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

// The same for the swapped kernel (kSwapped: coordinates (x row, W row)).
struct SwappedLayoutTestNoOp : LayoutTestNoOp {
  static constexpr bool kSwapped = true;
};

namespace {

using Holders = std::map<std::pair<int, int>, std::pair<int, int>>;  // (M, N) coordinate -> (thread, index)

// Who holds each accumulator of a kM x kN tile of `Kernel`'s TiledMma, as
// the epilogue partitions it; each held once.
template <class Kernel, int kM, int kN>
Holders holders() {
  typename Kernel::Mainloop::TiledMma mma;
  const auto tile = cute::make_identity_tensor(cute::make_shape(cute::Int<kM>{}, cute::Int<kN>{}));
  Holders holder;
  for (int thread = 0; thread < 128; ++thread) {
    const auto coords = mma.get_thread_slice(thread).partition_C(tile);
    for (int i = 0; i < int(cute::size(coords)); ++i) {
      const std::pair<int, int> at{int(cute::get<0>(coords(i))), int(cute::get<1>(coords(i)))};
      EXPECT_EQ(holder.count(at), 0u) << "(" << at.first << ", " << at.second << ") held twice";
      holder[at] = {thread, i};
    }
  }
  EXPECT_EQ(holder.size(), size_t(kM * kN));
  return holder;
}

template <int kRowsOfX>
void expect_epilogue_layout() {
  const Holders holder = holders<DecodeKernel<kRowsOfX, RegisterEpilogue<LayoutTestNoOp>>, 64, kRowsOfX>();
  ASSERT_EQ(holder.size(), size_t(64 * kRowsOfX));  // (W row, x row)
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

// The swapped kernel (x rows as wgmma's M, W rows as N) with W tiles of
// kWRows: each accumulator held once; W rows c and c + 1 (c even) of an x row
// at values i and i + 1 of one thread, and rows c + 8, c + 9 at i + 4, i + 5
// with i % 8 < 4 where c % 16 < 8 (cuda_cutlass_gated.cu's SwappedSiluMulOp).
template <int kWRows>
void expect_swapped_layout() {
  const Holders holder = holders<SwappedDecodeKernel<kWRows, RegisterEpilogue<SwappedLayoutTestNoOp>>, 64, kWRows>();
  ASSERT_EQ(holder.size(), size_t(64 * kWRows));  // (x row, W row)
  int apart = 0;
  for (const auto& [at, by] : holder) {
    const auto [x_row, row] = at;
    const auto [thread, i] = by;
    if (row % 16 >= 8 || row % 2 != 0) continue;
    const auto next = holder.at({x_row, row + 1}), up = holder.at({x_row, row + 8}),
               up_next = holder.at({x_row, row + 9});
    apart += i % 8 >= 4 || next != std::pair<int, int>{thread, i + 1} || up != std::pair<int, int>{thread, i + 4} ||
             up_next != std::pair<int, int>{thread, i + 5};
  }
  EXPECT_EQ(apart, 0) << "W tile of " << kWRows << " rows";
}

TEST(CudaCutlassLayout, SwappedGateAndUpRowsMeetWhereTheEpilogueLooks) {
  expect_swapped_layout<64>();
  expect_swapped_layout<96>();
}

}  // namespace
}  // namespace serval::cuda::cutlass_decode
