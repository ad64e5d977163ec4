// Matmuls of GGUF block weights kept packed on the GPU (Q4_0, Q8_0;
// backend/gpu_block_pack.h, cuda_gemv_packed.cu) against a double-precision
// product of the exactly dequantized matrix (to_f32 of the blocks): the packed
// GEMV for 1..16 rows on 7B decode shapes and odd ones (rows not a multiple of
// 8, an odd count of groups, a k-step tail), f32 logits, the dequantize + GEMM
// path past 16 rows, and batch invariance (the GEMV, 16 rows at a time). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/gpu_block_pack.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "model/linear.h"
#include "runtime/cuda_tuning.h"
#include "runtime/linear_upload.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif

namespace serval::testing {
namespace {

// A GGUF block matrix of `type` from random weights, and its exact f32 values.
struct BlockMatrix {
  std::vector<uint8_t> blocks;
  std::vector<float> values;
  Linear linear;
};
BlockMatrix block_matrix(DType type, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::vector<float> f(size_t(out * in));
  for (float& v : f) v = dist(rng);
  BlockMatrix m;
  m.blocks.resize(size_t(dtype_bytes(type, out * in)));
  from_f32(type, f.data(), m.blocks.data(), out * in);
  m.values.resize(f.size());
  to_f32(type, m.blocks.data(), m.values.data(), out * in);
  m.linear = linear_of(TensorView{"w", type, {out, in}, m.blocks.data(), int64_t(m.blocks.size())});
  return m;
}

std::unique_ptr<DeviceWeight> upload_block_matrix(Backend& be, const BlockMatrix& m) {
  be.keep_linear_formats(true);  // CudaTuning::packed_blocks auto leaves it to the caller
  int64_t bytes = 0;
  auto w = upload_linear(be, m.linear, bytes);
  EXPECT_EQ(w->format(), m.linear.format) << "the CUDA backend should keep " << m.linear.format.describe();
  const GpuBlockPack pack = GpuBlockPack::of(m.linear.format.dtype, m.linear.out, m.linear.in);
  EXPECT_EQ(bytes, pack.total_bytes()) << "kept at its size, not as bf16";
  return w;
}

constexpr double kBf16Tol = 5e-3;  // one bf16 rounding of the outputs
constexpr double kF32Tol = 1e-4;   // f32 sums of exact products
constexpr double kInt8XTol = 2e-2;  // int8 x (CudaTuning::packed_int8_x) against the exact product

struct Shape {
  int64_t in, out;
};
const Shape kShapes[] = {{4096, 4096}, {4096, 11008}, {11008, 4096}, {4096, 1000}, {160, 77}, {96, 13}, {4128, 24}};

TEST(CudaPackedMatmul, GemvMatchesTheDequantizedProductForEveryRowCount) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (DType type : {DType::Q4_0, DType::Q8_0})
    for (const Shape& s : kShapes) {
      const BlockMatrix m = block_matrix(type, s.out, s.in, uint32_t(s.in + s.out));
      const auto x = random_bf16(size_t(16 * s.in), 11 + uint32_t(s.in));
      const auto want = reference_matmul(x, 16, m.values, s.out, s.in);
      auto w = upload_block_matrix(*gpu, m);
      DevTensor xg = upload(*gpu, x, 16, s.in);
      double worst = 0;
#ifdef SERVAL_WITH_CUDA
      const int64_t calls = cuda::packed_gemv_calls(*gpu);
#endif
      for (int64_t T = 1; T <= 16; ++T) {
        DevTensor y = zeros(*gpu, T, s.out);
        gpu->matmul(xg.t.rows_view(0, T), *w, nullptr, y.t);
        const double err = rel_err(download(*gpu, y.t), want, size_t(T * s.out));
        worst = std::max(worst, err);
        EXPECT_LT(err, kBf16Tol) << dtype_name(type) << " T " << T << " in " << s.in << " out " << s.out;
      }
#ifdef SERVAL_WITH_CUDA
      EXPECT_EQ(cuda::packed_gemv_calls(*gpu) - calls, 16);
#endif
      std::printf("[packed gemv %s] in %ld out %ld, T 1..16: worst rel err %.2e\n",
                  std::string(dtype_name(type)).c_str(), long(s.in), long(s.out), worst);
    }
}

TEST(CudaPackedMatmul, GemvWritesExactF32Logits) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    const int64_t in = 4096, out = 32000;
    const BlockMatrix m = block_matrix(type, out, in, 3);
    const auto x = random_bf16(size_t(4 * in), 4);
    const auto want = reference_matmul(x, 4, m.values, out, in);
    auto w = upload_block_matrix(*gpu, m);
    DevTensor xg = upload(*gpu, x, 4, in);
    DeviceBuffer yb = gpu->alloc(4 * out * 4);
    const Tensor y{yb.data(), DType::F32, 4, out};
    gpu->matmul(xg.t, *w, nullptr, y);
    const double err = rel_err(download(*gpu, y), want, size_t(4 * out));
    EXPECT_LT(err, kF32Tol) << dtype_name(type);
    std::printf("[packed gemv %s] f32 logits [4, 32000]: rel err %.2e\n", std::string(dtype_name(type)).c_str(), err);
  }
}

// CudaTuning::packed_int8_x (on by default): 1 and 2 rows quantize x to
// int8 per 32 columns and multiply by dp4a; each result equals the product of
// that int8 x (bf16 outputs: one rounding; f32 logits: f32 sums of exact
// integer dots), within x's rounding of the exact product.
TEST(CudaPackedMatmul, OneAndTwoRowsOfInt8XAreTheProductOfTheirInt8X) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  CudaTuning int8;
  int8.packed_int8_x = true;
  auto gpu = create_backend("cuda", 0, "auto", int8);
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    for (const Shape& s : kShapes) {
      const BlockMatrix m = block_matrix(type, s.out, s.in, 5 + uint32_t(s.out));
      const auto x = random_bf16(size_t(2 * s.in), 6 + uint32_t(s.in));
      const auto exact = reference_matmul(x, 2, m.values, s.out, s.in);
      const auto want = reference_matmul(int8_x(x, 2, s.in), 2, m.values, s.out, s.in);
      auto w = upload_block_matrix(*gpu, m);
      DevTensor xg = upload(*gpu, x, 2, s.in);
      for (int64_t T : {1, 2}) {
        DevTensor y = zeros(*gpu, T, s.out);
        gpu->matmul(xg.t.rows_view(0, T), *w, nullptr, y.t);
        const std::vector<float> got = download(*gpu, y.t);
        const double err = rel_err(got, want, size_t(T * s.out));
        EXPECT_LT(err, kBf16Tol) << dtype_name(type) << " T " << T << " in " << s.in << " out " << s.out;
        EXPECT_LT(rel_err(got, exact, size_t(T * s.out)), kInt8XTol) << dtype_name(type) << " T " << T;
        std::printf("[packed gemv %s, int8 x] in %ld out %ld T %ld: rel err %.2e (exact product: %.2e)\n",
                    std::string(dtype_name(type)).c_str(), long(s.in), long(s.out), long(T), err,
                    rel_err(got, exact, size_t(T * s.out)));
      }
    }
    const int64_t in = 4096, out = 32000;
    const BlockMatrix m = block_matrix(type, out, in, 3);
    const auto x = random_bf16(size_t(in), 4);
    auto w = upload_block_matrix(*gpu, m);
    DevTensor xg = upload(*gpu, x, 1, in);
    DeviceBuffer yb = gpu->alloc(out * 4);
    const Tensor y{yb.data(), DType::F32, 1, out};
    gpu->matmul(xg.t, *w, nullptr, y);
    EXPECT_LT(rel_err(download(*gpu, y), reference_matmul(int8_x(x, 1, in), 1, m.values, out, in), size_t(out)),
              kF32Tol)
        << dtype_name(type) << ": f32 logits of one row of int8 x";
  }
  // q/k/v-like and mixed formats in one matmul_multi.
  const int64_t in = 512;
  const BlockMatrix a = block_matrix(DType::Q4_0, 512, in, 31), b = block_matrix(DType::Q8_0, 128, in, 32);
  auto wa = upload_block_matrix(*gpu, a);
  auto wb = upload_block_matrix(*gpu, b);
  for (int64_t T : {1, 2}) {
    const auto x = random_bf16(size_t(T * in), 33);
    const auto xr = int8_x(x, T, in);
    DevTensor xg = upload(*gpu, x, T, in);
    DevTensor ya = zeros(*gpu, T, 512), yb = zeros(*gpu, T, 128);
    gpu->matmul_multi(xg.t, {wa.get(), wb.get()}, {ya.t, yb.t});
    EXPECT_LT(rel_err(download(*gpu, ya.t), reference_matmul(xr, T, a.values, 512, in), size_t(T * 512)), kBf16Tol)
        << "T " << T;
    EXPECT_LT(rel_err(download(*gpu, yb.t), reference_matmul(xr, T, b.values, 128, in), size_t(T * 128)), kBf16Tol)
        << "T " << T;
  }
}

// More than 16 rows: the matrix dequantized for one GEMM.
TEST(CudaPackedMatmul, MoreRowsDequantizeForOneGemm) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (DType type : {DType::Q4_0, DType::Q8_0})
    for (const Shape& s : {Shape{4096, 1024}, Shape{160, 77}}) {
      const BlockMatrix m = block_matrix(type, s.out, s.in, 9);
      auto w = upload_block_matrix(*gpu, m);
      for (int64_t T : {17, 64, 300}) {
        const auto x = random_bf16(size_t(T * s.in), uint32_t(T));
        const auto want = reference_matmul(x, T, m.values, s.out, s.in);
        DevTensor xg = upload(*gpu, x, T, s.in);
        DevTensor y = zeros(*gpu, T, s.out);
#ifdef SERVAL_WITH_CUDA
        const int64_t passes = cuda::packed_gemv_calls(*gpu), gemms = cuda::dequantized_gemm_calls(*gpu);
#endif
        gpu->matmul(xg.t, *w, nullptr, y.t);
        EXPECT_LT(rel_err(download(*gpu, y.t), want, size_t(T * s.out)), kBf16Tol)
            << dtype_name(type) << " T " << T << " in " << s.in << " out " << s.out;
#ifdef SERVAL_WITH_CUDA
        EXPECT_EQ(cuda::packed_gemv_calls(*gpu) - passes, 0) << "T " << T;
        EXPECT_EQ(cuda::dequantized_gemm_calls(*gpu) - gemms, 1) << "T " << T;
#endif
      }
    }
}

// Batch-invariant mode: a row's output is bitwise the same alone and in a
// batch of any size (the GEMV, 16 rows at a time past 16).
TEST(CudaPackedMatmul, BatchInvariantRowsEqualTheirSoloBits) {
  SERVAL_CUDA_OR_SKIP(gpu);
  gpu->set_batch_invariant(true);
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    const int64_t in = 1024, out = 264, T = 37;
    const BlockMatrix m = block_matrix(type, out, in, 21);
    auto w = upload_block_matrix(*gpu, m);
    const auto x = random_bf16(size_t(T * in), 22);
    DevTensor xg = upload(*gpu, x, T, in);
    DevTensor all = zeros(*gpu, T, out);
    gpu->matmul(xg.t, *w, nullptr, all.t);
    const std::vector<float> batched = download(*gpu, all.t);
    for (int64_t t : {int64_t(0), int64_t(9), int64_t(16), int64_t(36)}) {
      DevTensor one = zeros(*gpu, 1, out);
      gpu->matmul(xg.t.rows_view(t, 1), *w, nullptr, one.t);
      const std::vector<float> solo = download(*gpu, one.t);
      EXPECT_TRUE(std::equal(solo.begin(), solo.end(), batched.begin() + t * out))
          << dtype_name(type) << ": row " << t << " differs alone and in a batch of " << T;
    }
  }
}

// A matmul_multi of packed weights (q/k/v, gate/up of a block-quantized model)
// computes each product.
TEST(CudaPackedMatmul, MatmulMultiComputesEachPackedWeight) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int64_t in = 512;
  const BlockMatrix a = block_matrix(DType::Q4_0, 512, in, 31), b = block_matrix(DType::Q8_0, 128, in, 32);
  auto wa = upload_block_matrix(*gpu, a);
  auto wb = upload_block_matrix(*gpu, b);
  for (int64_t T : {3, 40}) {
    const auto x = random_bf16(size_t(T * in), 33);
    DevTensor xg = upload(*gpu, x, T, in);
    DevTensor ya = zeros(*gpu, T, 512), yb = zeros(*gpu, T, 128);
    gpu->matmul_multi(xg.t, {wa.get(), wb.get()}, {ya.t, yb.t});
    EXPECT_LT(rel_err(download(*gpu, ya.t), reference_matmul(x, T, a.values, 512, in), size_t(T * 512)), 1e-2);
    EXPECT_LT(rel_err(download(*gpu, yb.t), reference_matmul(x, T, b.values, 128, in), size_t(T * 128)), 1e-2);
  }
}

}  // namespace
}  // namespace serval::testing
