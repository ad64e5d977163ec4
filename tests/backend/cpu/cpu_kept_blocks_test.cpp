// The CPU backend's GGUF block matrices kept in their blocks
// (CpuBackend::keep_linear_formats): held at the file's size, and every
// product bit for bit what the f32 matrix gives, on the streaming kernel (a
// few rows), sgemm (more) and the batch-invariant kernel.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/linear.h"
#include "runtime/linear_upload.h"

namespace serval {
namespace {

struct Blocks {
  std::vector<uint8_t> bytes;
  Linear linear;
};
Blocks random_blocks(DType type, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::vector<float> f(size_t(out * in));
  for (float& v : f) v = dist(rng);
  Blocks b;
  b.bytes.resize(size_t(dtype_bytes(type, out * in)));
  from_f32(type, f.data(), b.bytes.data(), out * in);
  b.linear = linear_of(TensorView{"w", type, {out, in}, b.bytes.data(), int64_t(b.bytes.size())});
  return b;
}

std::vector<float> product(CpuBackend& be, const DeviceWeight& w, const std::vector<float>& x, int64_t T) {
  std::vector<float> y(size_t(T * w.rows()));
  be.matmul(Tensor{const_cast<float*>(x.data()), DType::F32, T, w.cols()}, w, nullptr,
            Tensor{y.data(), DType::F32, T, w.rows()});
  return y;
}

TEST(CpuKeptBlocks, ProductsEqualTheF32MatrixBitForBit) {
  CpuBackend be(2);
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (bool invariant : {false, true}) {
      be.set_batch_invariant(invariant);
      const int64_t out = 48, in = 512;
      const Blocks b = random_blocks(type, out, in, 7);
      int64_t dense_bytes = 0, kept_bytes = 0;
      be.keep_linear_formats(false);
      EXPECT_FALSE(be.keeps_linear_format(b.linear.format));
      const auto dense = upload_linear(be, b.linear, dense_bytes);
      be.keep_linear_formats(true);
      ASSERT_TRUE(be.keeps_linear_format(b.linear.format));
      const auto kept = upload_linear(be, b.linear, kept_bytes);
      EXPECT_EQ(dense_bytes, out * in * 4);
      EXPECT_EQ(kept_bytes, int64_t(b.bytes.size()));
      EXPECT_EQ(kept->format(), b.linear.format);
      std::mt19937 rng(3);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (int64_t T : {1, 5, 20}) {
        std::vector<float> x(size_t(T * in));
        for (float& v : x) v = u(rng);
        EXPECT_EQ(product(be, *kept, x, T), product(be, *dense, x, T))
            << dtype_name(type) << " T " << T << (invariant ? " batch-invariant" : "");
      }
    }
}

TEST(CpuKeptBlocks, DenseFormatsAreNeverKept) {
  CpuBackend be(1);
  be.keep_linear_formats(true);
  EXPECT_FALSE(be.keeps_linear_format(LinearFormat::dense(DType::BF16)));
  EXPECT_TRUE(be.chooses_kept_formats());
}

}  // namespace
}  // namespace serval
