// CUTLASS's decode GEMM (bf16 products of 17..64 rows: by default those of
// 17..32 and 48..64, here all of them) against a
// double-precision reference: single products on decode and odd shapes, f32
// logits, a strided batch (matmul_multi). Each case also checks that CUTLASS
// computed it. (matmul_add_rmsnorm's split of k into two f32 partials, which
// CUTLASS computes at 32..64 rows: cuda_fused_ops_test.cpp.) Skips without a
// GPU or without CUTLASS in the build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif

namespace serval::testing {
namespace {

#ifdef SERVAL_WITH_CUDA
#define SERVAL_CUTLASS_OR_SKIP(gpu)                                                        \
  SERVAL_CUDA_OR_SKIP(gpu);                                                                \
  if (!cuda::use_cutlass_gemm(*gpu, true)) GTEST_SKIP() << "no CUTLASS in this build"
int64_t cutlass_calls(const Backend& be) { return cuda::cutlass_gemm_calls(be); }
#else
#define SERVAL_CUTLASS_OR_SKIP(gpu) SERVAL_CUDA_OR_SKIP(gpu)  // declares gpu (null) and skips
int64_t cutlass_calls(const Backend&) { return 0; }
#endif

constexpr double kBf16Tol = 5e-3;  // one bf16 rounding of the output; f32 sums
constexpr double kF32Tol = 1e-4;   // f32 outputs: the sums' order alone

TEST(CudaCutlassGemm, ProductsMatchReferenceFrom17To64Rows) {
  SERVAL_CUTLASS_OR_SKIP(gpu);
  struct Shape { int64_t in, out; };
  // Llama-2-7B's o and down; an output that is no multiple of the 64-row
  // tile; an input that is no multiple of the 128-wide k tile; outputs of
  // the 7B's and the 8B's q/k/v (the swapped kernel's W tiles of 96 and 48 at
  // 33-64 rows).
  for (const Shape& s : {Shape{4096, 4096}, Shape{11008, 4096}, Shape{1024, 1000}, Shape{1000, 512},
                         Shape{512, 12288}, Shape{512, 6144}}) {
    const int64_t T_max = 64;
    const auto x = random_bf16(size_t(T_max * s.in), 11);
    const auto w = random_bf16(size_t(s.out * s.in), 12, 0.05f);
    const auto want = reference_matmul(x, T_max, w, s.out, s.in);
    auto wg = upload_matrix(*gpu, "w", s.out, s.in, w);
    DevTensor xg = upload(*gpu, x, T_max, s.in);
    for (int64_t T : {17, 24, 31, 32, 33, 40, 47, 48, 57, 64}) {
      DevTensor y = zeros(*gpu, T, s.out);
      const int64_t before = cutlass_calls(*gpu);
      gpu->matmul(xg.t.rows_view(0, T), *wg, nullptr, y.t);
      EXPECT_EQ(cutlass_calls(*gpu) - before, 1) << "in " << s.in << " out " << s.out << " T " << T;
      EXPECT_LT(rel_err(download(*gpu, y.t), want, size_t(T * s.out)), kBf16Tol)
          << "in " << s.in << " out " << s.out << " T " << T;
    }
  }
}

TEST(CudaCutlassGemm, F32LogitsMatchReference) {
  SERVAL_CUTLASS_OR_SKIP(gpu);
  const int64_t in = 512, out = 2000;
  for (int64_t T : {24, 40, 64}) {  // each tile
    const auto x = random_bf16(size_t(T * in), 21);
    const auto w = random_bf16(size_t(out * in), 22, 0.05f);
    auto wg = upload_matrix(*gpu, "head", out, in, w);
    DevTensor xg = upload(*gpu, x, T, in);
    DeviceBuffer yb = gpu->alloc(T * out * 4);
    const Tensor y{yb.data(), DType::F32, T, out};
    const int64_t before = cutlass_calls(*gpu);
    gpu->matmul(xg.t, *wg, nullptr, y);
    EXPECT_EQ(cutlass_calls(*gpu) - before, 1) << "T " << T;
    std::vector<float> got(size_t(T * out));
    gpu->copy_to_host(got.data(), y.data, T * out * 4);
    EXPECT_LT(rel_err(got, reference_matmul(x, T, w, out, in), got.size()), kF32Tol) << "T " << T;
  }
}

// q/k/v laid out back to back (upload_weight_group): one strided batch of
// three, CUTLASS's L mode.
TEST(CudaCutlassGemm, StridedBatchMatchesReference) {
  SERVAL_CUTLASS_OR_SKIP(gpu);
  const int64_t T = 64, in = 1024, out = 768;
  std::vector<std::vector<float>> ws;
  std::vector<TensorView> views;
  ws.reserve(3);
  for (int i = 0; i < 3; ++i) {
    ws.push_back(random_bf16(size_t(out * in), 31 + uint32_t(i), 0.05f));
    views.push_back(TensorView{"w", DType::F32, {out, in}, ws.back().data(), int64_t(ws.back().size() * 4)});
  }
  const auto group = gpu->upload_weight_group(views);
  std::vector<const DeviceWeight*> wp;
  for (const auto& w : group) wp.push_back(w.get());
  const auto x = random_bf16(size_t(T * in), 34);
  DevTensor xg = upload(*gpu, x, T, in);
  const DeviceBuffer joint = gpu->alloc(3 * T * out * 2);
  std::vector<Tensor> ys;
  for (int i = 0; i < 3; ++i) ys.push_back(Tensor{static_cast<char*>(joint.data()) + i * T * out * 2, DType::BF16, T, out});
  const int64_t before = cutlass_calls(*gpu);
  gpu->matmul_multi(xg.t, wp, ys);
  EXPECT_EQ(cutlass_calls(*gpu) - before, 1) << "one launch for the batch of three";
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(rel_err(download(*gpu, ys[size_t(i)]), reference_matmul(x, T, ws[size_t(i)], out, in), size_t(T * out)),
              kBf16Tol)
        << "weight " << i;
}

// By default the rows where it measured faster (cuda_matmul.cu: all of
// 17..64); 16 rows (the GEMV) and off (cuBLASLt): none.
TEST(CudaCutlassGemm, TakesTheMeasuredRowsByDefaultAndNoneWhenOff) {
  SERVAL_CUTLASS_OR_SKIP(gpu);
  const int64_t in = 1024, out = 512;
  const auto x = random_bf16(size_t(64 * in), 51), w = random_bf16(size_t(out * in), 52, 0.05f);
  const auto want = reference_matmul(x, 64, w, out, in);
  auto wg = upload_matrix(*gpu, "w", out, in, w);
  DevTensor xg = upload(*gpu, x, 64, in), y = zeros(*gpu, 64, out);
#ifdef SERVAL_WITH_CUDA
  cuda::use_cutlass_gemm(*gpu, true);
#endif
  for (int64_t T : {16, 17, 32, 33, 47, 48, 64}) {
    const int64_t before = cutlass_calls(*gpu);
    gpu->matmul(xg.t.rows_view(0, T), *wg, nullptr, y.t.rows_view(0, T));
    EXPECT_EQ(cutlass_calls(*gpu) - before, T >= 17 ? 1 : 0) << "T " << T;
    EXPECT_LT(rel_err(download(*gpu, y.t.rows_view(0, T)), want, size_t(T * out)), kBf16Tol) << "T " << T;
  }
#ifdef SERVAL_WITH_CUDA
  cuda::use_cutlass_gemm(*gpu, false);
#endif
  const int64_t before = cutlass_calls(*gpu);
  for (int64_t T : {17, 64}) {
    gpu->matmul(xg.t.rows_view(0, T), *wg, nullptr, y.t.rows_view(0, T));
    EXPECT_LT(rel_err(download(*gpu, y.t.rows_view(0, T)), want, size_t(T * out)), kBf16Tol) << "T " << T;
  }
  EXPECT_EQ(cutlass_calls(*gpu), before) << "off: cuBLASLt";
}

}  // namespace
}  // namespace serval::testing
