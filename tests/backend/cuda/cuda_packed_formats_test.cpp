// The packed GEMV, its int8-x path and the dequantize + GEMM path for the
// formats packed beside Q4_0/Q8_0 (backend/gpu_block_pack.h): GGUF Q4_1,
// Q4_K, Q5_K, int4 g32/g64/g128 symmetric and asymmetric, int8 per channel.
// Each against the CPU reference (dequantize_linear, then a double product)
// within one bf16 rounding, which also bounds the pack's f16 rounding of
// scales and mins; f32 logits against the product of the packed weights
// themselves (unpack_gpu_blocks) to f32 rounding; 1, 2, 3, 8, 16, 17 and 64
// rows; odd group counts and widths padded to a k-step; the fused q/k/v
// (rope and KV write in the epilogue) and gate/up launches. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "backend/gpu_block_pack.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/rtn_quantize.h"
#include "runtime/cuda_tuning.h"
#include "runtime/linear_upload.h"
#include "runtime/rope.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif

namespace serval::testing {
namespace {

using Kind = LinearFormat::Kind;

const LinearFormat kForms[] = {
    LinearFormat::of_dtype(DType::Q4_1),  LinearFormat::of_dtype(DType::Q4_K), LinearFormat::of_dtype(DType::Q5_K),
    {Kind::Int4Grouped, DType::I8, 32, true},  {Kind::Int4Grouped, DType::I8, 32, false},
    {Kind::Int4Grouped, DType::I8, 64, true},  {Kind::Int4Grouped, DType::I8, 64, false},
    {Kind::Int4Grouped, DType::I8, 128, true}, {Kind::Int4Grouped, DType::I8, 128, false},
    {Kind::Int8PerChannel, DType::I8, 0, true},
};

// A width of an odd number of the format's groups (blocks), padded to a
// whole k-step where the format allows.
int64_t odd_width(const LinearFormat& f) {
  if (f.kind == Kind::GgufBlock) return f.dtype == DType::Q4_1 ? 7 * 32 : 3 * 256;
  if (f.kind == Kind::Int4Grouped) return f.group_size == 128 ? 3 * 128 : f.group_size == 64 ? 5 * 64 : 7 * 32;
  return 5 * 32;  // int8: padded to 192 (k-steps of 64)
}

// A matrix of `format` from random weights: the Linear, its CPU
// dequantization (the reference) and the packed weights' own values.
struct QuantMatrix {
  std::vector<uint8_t> blocks;        // GGUF
  std::unique_ptr<RtnMatrix> rtn;     // int4 / int8
  Linear linear;
  std::vector<float> values, packed;  // dequantize_linear; unpack_gpu_blocks
};
std::unique_ptr<QuantMatrix> quant_matrix(const LinearFormat& f, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::vector<float> w(size_t(out * in));
  for (float& v : w) v = dist(rng);
  auto m = std::make_unique<QuantMatrix>();
  if (f.kind == Kind::GgufBlock) {
    m->blocks.resize(size_t(dtype_bytes(f.dtype, out * in)));
    from_f32(f.dtype, w.data(), m->blocks.data(), out * in);
    m->linear = linear_of(TensorView{"w", f.dtype, {out, in}, m->blocks.data(), int64_t(m->blocks.size())});
  } else {
    m->rtn = std::make_unique<RtnMatrix>(quantize_matrix_rtn(f, "w", w.data(), out, in));
    m->linear = m->rtn->linear;
  }
  m->values = dequantize_linear(m->linear);
  const GpuBlockPack pack = GpuBlockPack::of(f, out, in);
  m->packed = unpack_gpu_blocks(pack, pack_linear(pack, m->linear).data());
  return m;
}

std::unique_ptr<DeviceWeight> upload_packed(Backend& be, const QuantMatrix& m) {
  be.keep_linear_formats(true);  // CudaTuning::packed_blocks auto leaves it to the caller
  int64_t bytes = 0;
  auto w = upload_linear(be, m.linear, bytes);
  EXPECT_EQ(w->format(), m.linear.format) << "the CUDA backend should keep " << m.linear.format.describe();
  EXPECT_EQ(bytes, GpuBlockPack::of(m.linear.format, m.linear.out, m.linear.in).total_bytes())
      << m.linear.format.describe() << ": kept at its size, not as bf16";
  return w;
}

constexpr double kBf16Tol = 5e-3;   // one bf16 rounding of the outputs
constexpr double kF32Tol = 1e-4;    // f32 sums of exact products
constexpr double kInt8XTol = 2e-2;  // int8 x against the exact product

std::unique_ptr<Backend> cuda_with_int8_x(bool on) {
  CudaTuning t;
  t.packed_int8_x = on;
  return create_backend("cuda", 0, "auto", t);
}

struct Shape {
  int64_t in, out;
};

TEST(CudaPackedFormats, GemvAndDequantizedGemmMatchTheCpuReference) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (const LinearFormat& f : kForms)
    for (const Shape& s : {Shape{odd_width(f), 77}, Shape{4096, 1000}, Shape{11008, 264}}) {
      const auto m = quant_matrix(f, s.out, s.in, uint32_t(s.in + s.out));
      auto w = upload_packed(*gpu, *m);
      const int64_t max_t = 64;
      const auto x = random_bf16(size_t(max_t * s.in), 11 + uint32_t(s.in));
      const auto want = reference_matmul(x, max_t, m->values, s.out, s.in);
      DevTensor xg = upload(*gpu, x, max_t, s.in);
      double worst = 0;
      for (int64_t T : {1, 2, 3, 8, 16, 17, 64}) {
#ifdef SERVAL_WITH_CUDA
        const int64_t gemvs = cuda::packed_gemv_calls(*gpu), gemms = cuda::dequantized_gemm_calls(*gpu);
#endif
        DevTensor y = zeros(*gpu, T, s.out);
        gpu->matmul(xg.t.rows_view(0, T), *w, nullptr, y.t);
        const double err = rel_err(download(*gpu, y.t), want, size_t(T * s.out));
        worst = std::max(worst, err);
        EXPECT_LT(err, kBf16Tol) << f.describe() << " T " << T << " in " << s.in << " out " << s.out;
#ifdef SERVAL_WITH_CUDA
        EXPECT_EQ(cuda::packed_gemv_calls(*gpu) - gemvs, T <= 16 ? 1 : 0) << f.describe() << " T " << T;
        EXPECT_EQ(cuda::dequantized_gemm_calls(*gpu) - gemms, T <= 16 ? 0 : 1) << f.describe() << " T " << T;
#endif
      }
      std::printf("[packed %s] in %ld out %ld, T 1..64: worst rel err %.2e\n", f.describe().c_str(), long(s.in),
                  long(s.out), worst);
    }
}

// f32 logits: the GEMV's sums of the packed weights' exact products.
TEST(CudaPackedFormats, GemvWritesExactF32LogitsOfThePackedWeights) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (const LinearFormat& f : kForms) {
    const int64_t in = 4096, out = 4000, T = 4;
    const auto m = quant_matrix(f, out, in, 3);
    const auto x = random_bf16(size_t(T * in), 4);
    auto w = upload_packed(*gpu, *m);
    DevTensor xg = upload(*gpu, x, T, in);
    DeviceBuffer yb = gpu->alloc(T * out * 4);
    const Tensor y{yb.data(), DType::F32, T, out};
    gpu->matmul(xg.t, *w, nullptr, y);
    const std::vector<float> got = download(*gpu, y);
    const double err = rel_err(got, reference_matmul(x, T, m->packed, out, in), size_t(T * out));
    EXPECT_LT(err, kF32Tol) << f.describe();
    EXPECT_LT(rel_err(got, reference_matmul(x, T, m->values, out, in), size_t(T * out)), kBf16Tol) << f.describe();
    std::printf("[packed %s] f32 logits [4, 4000]: rel err %.2e against the packed weights\n",
                f.describe().c_str(), err);
  }
}

// CudaTuning::packed_int8_x: 1 and 2 rows through dp4a, each the product of
// its int8 x (within bf16 rounding) and within x's rounding of the exact one.
TEST(CudaPackedFormats, OneAndTwoRowsOfInt8XAreTheProductOfTheirInt8X) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  auto gpu = cuda_with_int8_x(true);
  for (const LinearFormat& f : kForms)
    for (const Shape& s : {Shape{odd_width(f), 77}, Shape{4096, 1000}}) {
      const auto m = quant_matrix(f, s.out, s.in, 5 + uint32_t(s.out));
      const auto x = random_bf16(size_t(2 * s.in), 6 + uint32_t(s.in));
      const auto exact = reference_matmul(x, 2, m->values, s.out, s.in);
      const auto want = reference_matmul(int8_x(x, 2, s.in), 2, m->packed, s.out, s.in);
      auto w = upload_packed(*gpu, *m);
      DevTensor xg = upload(*gpu, x, 2, s.in);
      for (int64_t T : {1, 2}) {
        DevTensor y = zeros(*gpu, T, s.out);
        gpu->matmul(xg.t.rows_view(0, T), *w, nullptr, y.t);
        const std::vector<float> got = download(*gpu, y.t);
        const double err = rel_err(got, want, size_t(T * s.out)), off = rel_err(got, exact, size_t(T * s.out));
        EXPECT_LT(err, kBf16Tol) << f.describe() << " T " << T << " in " << s.in << " out " << s.out;
        EXPECT_LT(off, kInt8XTol) << f.describe() << " T " << T << " in " << s.in;
        std::printf("[packed %s, int8 x] in %ld out %ld T %ld: rel err %.2e (exact product: %.2e)\n",
                    f.describe().c_str(), long(s.in), long(s.out), long(T), err, off);
      }
    }
}

// The fused launches, int8 x off and on: q/k/v with rope and the KV write in
// the epilogue bitwise equal to the products then rope_kv_write (the Backend
// default), q within bf16 of the CPU reference; gate/up's silu(g) * u within
// two bf16 roundings of the reference.
TEST(CudaPackedFormats, FusedQkvAndGateUpLaunchesMatchTheReference) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  const int32_t head_dim = 64, q_heads = 8, kv_heads = 2;
  const int64_t hidden = 768, qw = q_heads * head_dim, kw = kv_heads * head_dim, inter = 640;
  for (bool int8 : {false, true}) {
    auto gpu = cuda_with_int8_x(int8);
    ModelConfig cfg;
    cfg.head_dim = head_dim;
    cfg.rope_dim = head_dim;
    cfg.rope_theta = 10000;
    const std::vector<float> inv = rope_inv_freq(cfg, {});
    DeviceBuffer freq = gpu->alloc(int64_t(inv.size() * 4));
    gpu->copy_to_device(freq.data(), inv.data(), int64_t(inv.size() * 4));
    const RopeParams rp{RopeStyle::Interleaved, head_dim, head_dim, static_cast<const float*>(freq.data())};
    for (const LinearFormat& f : kForms) {
      const auto mq = quant_matrix(f, qw, hidden, 81), mk = quant_matrix(f, kw, hidden, 82),
                 mv = quant_matrix(f, kw, hidden, 83);
      const auto mg = quant_matrix(f, inter, hidden, 84), mu = quant_matrix(f, inter, hidden, 85);
      auto wq = upload_packed(*gpu, *mq), wk = upload_packed(*gpu, *mk), wv = upload_packed(*gpu, *mv);
      auto wg = upload_packed(*gpu, *mg), wu = upload_packed(*gpu, *mu);
      for (int64_t T : {1, 2, 3, 16}) {
        const auto x = random_bf16(size_t(T * hidden), 86 + uint32_t(T));
        const auto xr = int8 && T <= 2 ? int8_x(x, T, hidden) : x;
        DevTensor xt = upload(*gpu, x, T, hidden);
        std::vector<int32_t> pos(static_cast<size_t>(T));
        std::vector<int64_t> slots(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t * 977 % 9001), slots[size_t(t)] = (t * 37 + 5) % 64;
        DeviceBuffer pb = upload_ints(*gpu, pos), sb = upload_ints(*gpu, slots);
        const KvGeometry g{4, 16, kv_heads, head_dim};
        std::vector<float> q_out[2];
        std::vector<uint16_t> pools[2][2];
        for (int fused = 0; fused < 2; ++fused) {
          KvLayer kv = gpu->alloc_kv_layer(g);
          DevTensor qt = zeros(*gpu, T, qw), kt = zeros(*gpu, T, kw), vt = zeros(*gpu, T, kw);
          const auto* pp = static_cast<const int32_t*>(pb.data());
          const auto* sp = static_cast<const int64_t*>(sb.data());
          if (fused)
            gpu->qkv_rope_kv_write(xt.t, *wq, *wk, *wv, qt.t, kt.t, vt.t, pp, rp, sp, kv, g);
          else
            gpu->Backend::qkv_rope_kv_write(xt.t, *wq, *wk, *wv, qt.t, kt.t, vt.t, pp, rp, sp, kv, g);
          q_out[fused] = download(*gpu, qt.t);
          const int64_t elems = g.num_blocks * g.block_size * kw;
          for (int i = 0; i < 2; ++i) {
            pools[fused][i].resize(size_t(elems));
            gpu->copy_to_host(pools[fused][i].data(), (i == 0 ? kv.k : kv.v).data(), elems * 2);
          }
        }
        const std::string what = f.describe() + " T " + std::to_string(T) + (int8 ? " int8 x" : "");
        EXPECT_EQ(q_out[1], q_out[0]) << "q, " << what;
        EXPECT_EQ(pools[1][0], pools[0][0]) << "K pool, " << what;
        EXPECT_EQ(pools[1][1], pools[0][1]) << "V pool, " << what;
        // q unrotated at position 0 is the product: check the product itself via matmul.
        DevTensor qp = zeros(*gpu, T, qw);
        gpu->matmul(xt.t, *wq, nullptr, qp.t);
        EXPECT_LT(rel_err(download(*gpu, qp.t), reference_matmul(xr, T, mq->packed, qw, hidden), size_t(T * qw)),
                  kBf16Tol)
            << "q product, " << what;

        DevTensor gb = zeros(*gpu, T, inter), ub = zeros(*gpu, T, inter), out = zeros(*gpu, T, inter);
        gpu->gated_mlp_up(xt.t, *wg, *wu, gb.t, ub.t, out.t);
        const auto rg = reference_matmul(xr, T, mg->packed, inter, hidden);
        const auto ru = reference_matmul(xr, T, mu->packed, inter, hidden);
        std::vector<double> want(rg.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = rg[i] / (1.0 + std::exp(-rg[i])) * ru[i];
        EXPECT_LT(rel_err(download(*gpu, out.t), want, want.size()), 2 * kBf16Tol) << "gate/up, " << what;
      }
    }
  }
}

}  // namespace
}  // namespace serval::testing
