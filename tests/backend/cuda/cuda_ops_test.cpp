// Each elementwise, norm, rope, KV and matmul op of the CUDA backend against
// the CPU backend on the same bf16-rounded inputs. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cuda_test_util.h"
#include "runtime/rope.h"

namespace serval::testing {
namespace {

struct Pair {
  std::unique_ptr<Backend> cpu = create_backend("cpu", 0);
};

std::unique_ptr<DeviceWeight> weight(Backend& be, const std::string& name, std::vector<int64_t> shape,
                                     const std::vector<float>& v) {
  return be.upload_weight(TensorView{name, DType::F32, std::move(shape), v.data(), int64_t(v.size() * 4)});
}

TEST(CudaOps, EmbeddingAndGatherRowsCopyExactly) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  const int64_t V = 100, H = 64, T = 9;
  const auto table = random_bf16(size_t(V * H), 1);
  std::vector<int32_t> ids = {5, 0, 99, 5, 17, 42, 1, 98, 3};
  auto w_c = weight(*cpu, "emb", {V, H}, table), w_g = weight(*gpu, "emb", {V, H}, table);
  DeviceBuffer id_c = upload_ints(*cpu, ids), id_g = upload_ints(*gpu, ids);
  DevTensor o_c = zeros(*cpu, T, H), o_g = zeros(*gpu, T, H);
  cpu->embedding(*w_c, static_cast<int32_t*>(id_c.data()), {}, o_c.t);
  gpu->embedding(*w_g, static_cast<int32_t*>(id_g.data()), {}, o_g.t);
  EXPECT_EQ(download(*gpu, o_g.t), download(*cpu, o_c.t));

  std::vector<int32_t> rows = {8, 0, 3};
  DeviceBuffer r_c = upload_ints(*cpu, rows), r_g = upload_ints(*gpu, rows);
  DevTensor g_c = zeros(*cpu, 3, H), g_g = zeros(*gpu, 3, H);
  cpu->gather_rows(o_c.t, static_cast<int32_t*>(r_c.data()), g_c.t);
  gpu->gather_rows(o_g.t, static_cast<int32_t*>(r_g.data()), g_g.t);
  EXPECT_EQ(download(*gpu, g_g.t), download(*cpu, g_c.t));
}

TEST(CudaOps, RmsNormAndAddRmsNormMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (int64_t cols : {8, 64, 172, 4096}) {
    const int64_t rows = 7;
    const auto x = random_bf16(size_t(rows * cols), 2, 3.0f), d = random_bf16(size_t(rows * cols), 3);
    const auto w = random_bf16(size_t(cols), 4);
    auto w_c = weight(*cpu, "norm", {cols}, w), w_g = weight(*gpu, "norm", {cols}, w);
    DevTensor x_c = upload(*cpu, x, rows, cols), x_g = upload(*gpu, x, rows, cols);
    DevTensor o_c = zeros(*cpu, rows, cols), o_g = zeros(*gpu, rows, cols);
    cpu->rmsnorm(x_c.t, *w_c, 1e-5f, o_c.t);
    gpu->rmsnorm(x_g.t, *w_g, 1e-5f, o_g.t);
    EXPECT_LT(max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t)), 1e-2) << "rmsnorm cols " << cols;

    DevTensor d_c = upload(*cpu, d, rows, cols), d_g = upload(*gpu, d, rows, cols);
    cpu->add_rmsnorm(x_c.t, d_c.t, *w_c, 1e-5f, o_c.t);
    gpu->add_rmsnorm(x_g.t, d_g.t, *w_g, 1e-5f, o_g.t);
    EXPECT_LT(max_rel_diff(download(*gpu, x_g.t), download(*cpu, x_c.t)), 1e-2) << "residual cols " << cols;
    EXPECT_LT(max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t)), 1e-2) << "add_rmsnorm cols " << cols;
  }
}

TEST(CudaOps, AddAndSiluMulMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (int64_t cols : {172, 11008}) {
    const int64_t rows = 3;
    const auto a = random_bf16(size_t(rows * cols), 5, 4.0f), b = random_bf16(size_t(rows * cols), 6, 2.0f);
    DevTensor a_c = upload(*cpu, a, rows, cols), a_g = upload(*gpu, a, rows, cols);
    DevTensor b_c = upload(*cpu, b, rows, cols), b_g = upload(*gpu, b, rows, cols);
    DevTensor o_c = zeros(*cpu, rows, cols), o_g = zeros(*gpu, rows, cols);
    cpu->silu_mul(a_c.t, b_c.t, o_c.t);
    gpu->silu_mul(a_g.t, b_g.t, o_g.t);
    EXPECT_LT(max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t)), 1e-2) << "silu_mul cols " << cols;
    cpu->add(a_c.t, b_c.t);
    gpu->add(a_g.t, b_g.t);
    EXPECT_LT(max_rel_diff(download(*gpu, a_g.t), download(*cpu, a_c.t)), 1e-2) << "add cols " << cols;
  }
}

TEST(CudaOps, MatmulMatchesCpuForDecodeAndPrefillShapes) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  struct Shape { int64_t T, in, out; bool bias; };
  // Rows 1..16 take the GEMV kernel, more rows cuBLASLt.
  for (const Shape& s : {Shape{1, 4096, 4096, false}, Shape{5, 64, 172, true}, Shape{77, 256, 512, false},
                         Shape{1, 128, 32000, false}, Shape{300, 512, 1024, true}, Shape{8, 11008, 256, false},
                         Shape{3, 4096, 1000, true}, Shape{9, 1024, 96, false}}) {
    const auto x = random_bf16(size_t(s.T * s.in), 7), w = random_bf16(size_t(s.out * s.in), 8, 0.05f);
    const auto b = random_bf16(size_t(s.out), 9);
    auto w_c = weight(*cpu, "w", {s.out, s.in}, w), w_g = weight(*gpu, "w", {s.out, s.in}, w);
    auto b_c = weight(*cpu, "b", {s.out}, b), b_g = weight(*gpu, "b", {s.out}, b);
    DevTensor x_c = upload(*cpu, x, s.T, s.in), x_g = upload(*gpu, x, s.T, s.in);
    DevTensor y_c = zeros(*cpu, s.T, s.out), y_g = zeros(*gpu, s.T, s.out);
    cpu->matmul(x_c.t, *w_c, s.bias ? b_c.get() : nullptr, y_c.t);
    gpu->matmul(x_g.t, *w_g, s.bias ? b_g.get() : nullptr, y_g.t);
    EXPECT_LT(max_rel_diff(download(*gpu, y_g.t), download(*cpu, y_c.t)), 1e-2)
        << "T " << s.T << " in " << s.in << " out " << s.out;
  }
}

TEST(CudaOps, MatmulMultiEqualsSeparateMatmuls) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (int64_t T : {1, 6, 20}) {
    const int64_t in = 512;
    const int64_t outs[3] = {512, 128, 128};
    const auto x = random_bf16(size_t(T * in), 30);
    DevTensor xt = upload(*gpu, x, T, in);
    std::vector<std::unique_ptr<DeviceWeight>> ws;
    std::vector<const DeviceWeight*> wp;
    std::vector<DevTensor> fused, single;
    std::vector<Tensor> yp;
    for (int i = 0; i < 3; ++i) {
      ws.push_back(weight(*gpu, "w", {outs[i], in}, random_bf16(size_t(outs[i] * in), 31 + i, 0.05f)));
      wp.push_back(ws.back().get());
      fused.push_back(zeros(*gpu, T, outs[i]));
      single.push_back(zeros(*gpu, T, outs[i]));
      yp.push_back(fused.back().t);
    }
    gpu->matmul_multi(xt.t, wp, yp);
    for (int i = 0; i < 3; ++i) {
      gpu->matmul(xt.t, *ws[size_t(i)], nullptr, single[size_t(i)].t);
      EXPECT_EQ(download(*gpu, fused[size_t(i)].t), download(*gpu, single[size_t(i)].t)) << "T " << T << " w " << i;
    }
  }
}

TEST(CudaOps, MatmulWritesF32LogitsForTheLmHead) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (int64_t T : {1, 4, 12}) {
    const int64_t in = 256, out = 3000;
    const auto x = random_bf16(size_t(T * in), 20), w = random_bf16(size_t(out * in), 21, 0.1f);
    auto w_c = weight(*cpu, "head", {out, in}, w), w_g = weight(*gpu, "head", {out, in}, w);
    DevTensor x_c = upload(*cpu, x, T, in), x_g = upload(*gpu, x, T, in);
    DevTensor y_c = zeros(*cpu, T, out);
    DeviceBuffer y_buf = gpu->alloc(T * out * 4);
    const Tensor y_g{y_buf.data(), DType::F32, T, out};
    cpu->matmul(x_c.t, *w_c, nullptr, y_c.t);
    gpu->matmul(x_g.t, *w_g, nullptr, y_g);
    // f32 output: only the summation order differs.
    EXPECT_LT(max_rel_diff(download(*gpu, y_g), download(*cpu, y_c.t)), 1e-4) << "T " << T;
  }
}

TEST(CudaOps, RopeMatchesCpuForEveryStyleAndScaling) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (const RopeCase& c : rope_cases()) {
    const std::vector<float> inv = rope_case_inv_freq(c);
    const int64_t T = 6, qh = 4, kh = 2;
    const std::vector<int32_t> pos = {0, 1, 17, 511, 4095, 30000};
    const auto q = random_bf16(size_t(T * qh * c.head_dim), 10), k = random_bf16(size_t(T * kh * c.head_dim), 11);
    std::vector<float> results[2][2];
    int i = 0;
    for (Backend* be : {cpu.get(), gpu.get()}) {
      DeviceBuffer f = be->alloc(int64_t(inv.size() * 4));
      be->copy_to_device(f.data(), inv.data(), int64_t(inv.size() * 4));
      DeviceBuffer p = upload_ints(*be, pos);
      DevTensor qt = upload(*be, q, T, qh * c.head_dim), kt = upload(*be, k, T, kh * c.head_dim);
      RopeParams rp{c.style, int32_t(c.head_dim), int32_t(c.rope_dim), static_cast<const float*>(f.data())};
      be->rope(qt.t, kt.t, static_cast<int32_t*>(p.data()), rp);
      results[i][0] = download(*be, qt.t);
      results[i][1] = download(*be, kt.t);
      ++i;
    }
    EXPECT_LT(max_rel_diff(results[1][0], results[0][0]), 1e-2) << "q, head_dim " << c.head_dim;
    EXPECT_LT(max_rel_diff(results[1][1], results[0][1]), 1e-2) << "k, head_dim " << c.head_dim;
  }
}

TEST(CudaOps, KvWriteAndCopyKvBlockPlaceRowsAtTheirSlots) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (int32_t head_dim : {8, 128, 6}) {
    KvGeometry g{8, 4, 2, head_dim};
    KvLayer kv = gpu->alloc_kv_layer(g);
    const int64_t row = 2 * head_dim, T = 5;
    const std::vector<int64_t> slots = {31, 0, 6, 5, 17};
    const auto k = random_bf16(size_t(T * row), 12), v = random_bf16(size_t(T * row), 13);
    DevTensor kt = upload(*gpu, k, T, row), vt = upload(*gpu, v, T, row);
    DeviceBuffer s = upload_ints(*gpu, slots);
    gpu->kv_write(kt.t, vt.t, static_cast<int64_t*>(s.data()), kv, g);
    gpu->copy_kv_block(kv, g, 1, 3);  // slots 4..7 -> 12..15
    const int64_t elems = g.num_blocks * g.block_size * row;
    std::vector<uint16_t> K(static_cast<size_t>(elems)), V(static_cast<size_t>(elems));
    gpu->copy_to_host(K.data(), kv.k.data(), elems * 2);
    gpu->copy_to_host(V.data(), kv.v.data(), elems * 2);
    auto check = [&](int64_t slot, int64_t t) {
      for (int64_t e = 0; e < row; ++e) {
        ASSERT_EQ(bf16_to_f32(K[size_t(slot * row + e)]), k[size_t(t * row + e)]) << "slot " << slot;
        ASSERT_EQ(bf16_to_f32(V[size_t(slot * row + e)]), v[size_t(t * row + e)]) << "slot " << slot;
      }
    };
    for (int64_t t = 0; t < T; ++t) check(slots[size_t(t)], t);
    check(14, 2);  // slot 6 copied with block 1
    check(13, 3);  // slot 5
  }
}

// copy_to_device_async takes its bytes before it returns (the source is
// rewritten at once here), and its copies land in order: copies to one
// address leave the last. A copy larger than the staging arena makes it wait
// and grow while earlier copies are in flight.
TEST(CudaOps, AsyncCopiesLandInOrderAndTakeTheirBytesAtOnce) {
  SERVAL_CUDA_OR_SKIP(gpu);
  constexpr int kCopies = 300;
  constexpr int64_t kInts = 1024;    // 4 KB each: 300 of them overflow a 1 MiB arena
  constexpr int64_t kBig = 3 << 20;  // ints: 12 MB in one copy
  DeviceBuffer each = gpu->alloc(kCopies * kInts * 4), same = gpu->alloc(kInts * 4), big = gpu->alloc(kBig * 4);
  std::vector<int32_t> src(static_cast<size_t>(kBig));
  for (int c = 0; c < kCopies; ++c) {
    std::fill(src.begin(), src.begin() + kInts, c);
    gpu->copy_to_device_async(static_cast<int32_t*>(each.data()) + c * kInts, src.data(), kInts * 4);
    gpu->copy_to_device_async(same.data(), src.data(), kInts * 4);
    if (c == kCopies / 2) {
      std::iota(src.begin(), src.end(), 7);
      gpu->copy_to_device_async(big.data(), src.data(), kBig * 4);
    }
    std::fill(src.begin(), src.end(), -1);  // the staged bytes must not change
  }
  std::vector<int32_t> got(static_cast<size_t>(kCopies * kInts));
  gpu->copy_to_host(got.data(), each.data(), kCopies * kInts * 4);
  for (int64_t i = 0; i < kCopies * kInts; ++i) ASSERT_EQ(got[size_t(i)], int32_t(i / kInts)) << i;
  std::vector<int32_t> last(static_cast<size_t>(kInts));
  gpu->copy_to_host(last.data(), same.data(), kInts * 4);
  EXPECT_EQ(last, std::vector<int32_t>(static_cast<size_t>(kInts), kCopies - 1));
  std::vector<int32_t> bigs(static_cast<size_t>(kBig));
  gpu->copy_to_host(bigs.data(), big.data(), kBig * 4);
  for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(bigs[size_t(i)], int32_t(i + 7)) << i;
}

}  // namespace
}  // namespace serval::testing
