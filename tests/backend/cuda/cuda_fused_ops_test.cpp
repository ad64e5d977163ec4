// The CUDA backend's fused and mixed-dtype ops: the f32 residual stream
// (embedding into f32, add_rmsnorm and rmsnorm reading f32 and writing bf16,
// add and gather_rows on f32) against the CPU backend, and rope_kv_write
// against rope followed by kv_write. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "core/dtype.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif
#include "runtime/rope.h"

namespace serval::testing {
namespace {

std::unique_ptr<DeviceWeight> weight(Backend& be, const std::string& name, std::vector<int64_t> shape,
                                     const std::vector<float>& v) {
  return be.upload_weight(TensorView{name, DType::F32, std::move(shape), v.data(), int64_t(v.size() * 4)});
}

// An f32 tensor on any backend (the residual stream's dtype).
DevTensor upload_f32(Backend& be, const std::vector<float>& values, int64_t rows, int64_t cols) {
  DevTensor d;
  d.buf = be.alloc(rows * cols * 4 + 64);
  d.t = Tensor{d.buf.data(), DType::F32, rows, cols};
  be.copy_to_device(d.t.data, values.data(), int64_t(values.size()) * 4);
  return d;
}

// Rope frequencies (theta 10000) in device memory, and the RopeParams that use them.
struct DeviceRope {
  DeviceBuffer freq;
  RopeParams params;
};
DeviceRope device_rope(Backend& be, RopeStyle style, int32_t head_dim, int32_t rope_dim) {
  ModelConfig cfg;
  cfg.head_dim = head_dim;
  cfg.rope_dim = rope_dim;
  cfg.rope_theta = 10000;
  const std::vector<float> inv = rope_inv_freq(cfg, {});
  DeviceRope r;
  r.freq = be.alloc(int64_t(inv.size() * 4));
  be.copy_to_device(r.freq.data(), inv.data(), int64_t(inv.size() * 4));
  r.params = RopeParams{style, head_dim, rope_dim, static_cast<const float*>(r.freq.data())};
  return r;
}

// Positions spread over 9001 and slots distinct for T <= slot_count (37 is
// prime to the power-of-two counts used), in device memory.
struct TokenRows {
  DeviceBuffer positions, slots;
};
TokenRows token_rows(Backend& be, int64_t T, int64_t slot_count) {
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    pos[size_t(t)] = int32_t((t * 977) % 9001);
    slots[size_t(t)] = (t * 37 + 5) % slot_count;
  }
  return {upload_ints(be, pos), upload_ints(be, slots)};
}

TEST(CudaFusedOps, F32ResidualStreamOpsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  double worst = 0;
  for (int64_t cols : {8, 36, 4096}) {
    const int64_t rows = 5, V = 50;
    // Residual values with more precision than bf16 holds: an f32 stream keeps them.
    std::vector<float> x(size_t(rows * cols));
    std::mt19937 rng{uint32_t(cols)};
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (float& f : x) f = dist(rng);
    const auto d = random_bf16(size_t(rows * cols), 21), w = random_bf16(size_t(cols), 22);
    const auto table = random_bf16(size_t(V * cols), 23);
    auto w_c = weight(*cpu, "norm", {cols}, w), w_g = weight(*gpu, "norm", {cols}, w);
    auto t_c = weight(*cpu, "emb", {V, cols}, table), t_g = weight(*gpu, "emb", {V, cols}, table);

    // embedding into an f32 stream: exact.
    const std::vector<int32_t> ids = {3, 49, 0, 3, 7};
    DeviceBuffer id_c = upload_ints(*cpu, ids), id_g = upload_ints(*gpu, ids);
    DevTensor e_c = upload_f32(*cpu, x, rows, cols), e_g = upload_f32(*gpu, x, rows, cols);
    cpu->embedding(*t_c, static_cast<int32_t*>(id_c.data()), {}, e_c.t);
    gpu->embedding(*t_g, static_cast<int32_t*>(id_g.data()), {}, e_g.t);
    EXPECT_EQ(download(*gpu, e_g.t), download(*cpu, e_c.t)) << "embedding into f32, cols " << cols;

    DevTensor x_c = upload_f32(*cpu, x, rows, cols), x_g = upload_f32(*gpu, x, rows, cols);
    DevTensor d_c = upload(*cpu, d, rows, cols), d_g = upload(*gpu, d, rows, cols);
    DevTensor o_c = zeros(*cpu, rows, cols), o_g = zeros(*gpu, rows, cols);
    cpu->rmsnorm(x_c.t, *w_c, 1e-5f, o_c.t);
    gpu->rmsnorm(x_g.t, *w_g, 1e-5f, o_g.t);
    const double rn = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(rn, 1e-2) << "rmsnorm f32 -> bf16, cols " << cols;

    cpu->add_rmsnorm(x_c.t, d_c.t, *w_c, 1e-5f, o_c.t);
    gpu->add_rmsnorm(x_g.t, d_g.t, *w_g, 1e-5f, o_g.t);
    // The residual itself is f32 on both: equal up to f32 rounding of one add.
    const double res = max_rel_diff(download(*gpu, x_g.t), download(*cpu, x_c.t));
    EXPECT_LT(res, 1e-6) << "f32 residual after add_rmsnorm, cols " << cols;
    const double an = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(an, 1e-2) << "add_rmsnorm output, cols " << cols;

    cpu->add(x_c.t, d_c.t);
    gpu->add(x_g.t, d_g.t);
    EXPECT_LT(max_rel_diff(download(*gpu, x_g.t), download(*cpu, x_c.t)), 1e-6) << "add into f32, cols " << cols;

    const std::vector<int32_t> sel = {4, 0, 2};
    DeviceBuffer s_c = upload_ints(*cpu, sel), s_g = upload_ints(*gpu, sel);
    DevTensor g_c = upload_f32(*cpu, std::vector<float>(size_t(3 * cols), 0.5f), 3, cols);
    DevTensor g_g = upload_f32(*gpu, std::vector<float>(size_t(3 * cols), 0.5f), 3, cols);
    cpu->gather_rows(x_c.t, static_cast<int32_t*>(s_c.data()), g_c.t);
    gpu->gather_rows(x_g.t, static_cast<int32_t*>(s_g.data()), g_g.t);
    EXPECT_EQ(download(*gpu, g_g.t), download(*cpu, g_c.t)) << "gather_rows f32, cols " << cols;
    worst = std::max({worst, rn, an, res});
  }
  std::printf("[f32 residual ops] worst relative difference vs CPU %.2e\n", worst);
}

// qkv_rope_kv_write on the CUDA backend (up to 16 rows and interleaved rope:
// the GEMV rotates q and k and writes the pools in its epilogue) against the
// Backend default it replaces (matmul_multi, then rope_kv_write): q and both
// pools bitwise equal, for 1..16 rows (all three GEMV kernels), full and
// partial rotary dims, MHA and GQA; NeoX rope and 20 rows take the default.
TEST(CudaFusedOps, QkvRopeKvWriteEqualsProjectionThenRopeKvWrite) {
  SERVAL_CUDA_OR_SKIP(gpu);
  struct Case { RopeStyle style; int32_t head_dim, rope_dim, q_heads, kv_heads; int64_t hidden; };
  int cases = 0;
  for (const Case& c : {Case{RopeStyle::Interleaved, 128, 128, 8, 8, 1024}, Case{RopeStyle::Interleaved, 64, 32, 8, 2, 512},
                        Case{RopeStyle::Interleaved, 8, 8, 6, 2, 256}, Case{RopeStyle::Neox, 64, 64, 4, 4, 256}}) {
    const DeviceRope rope = device_rope(*gpu, c.style, c.head_dim, c.rope_dim);
    const RopeParams& rp = rope.params;
    const int64_t qw = int64_t(c.q_heads) * c.head_dim, kw = int64_t(c.kv_heads) * c.head_dim;
    const auto wq = random_bf16(size_t(qw * c.hidden), 71, 0.05f), wk = random_bf16(size_t(kw * c.hidden), 72, 0.05f),
               wv = random_bf16(size_t(kw * c.hidden), 73, 0.05f);
    auto gq = weight(*gpu, "wq", {qw, c.hidden}, wq), gk = weight(*gpu, "wk", {kw, c.hidden}, wk),
         gv = weight(*gpu, "wv", {kw, c.hidden}, wv);
    for (int64_t T : {int64_t(1), int64_t(3), int64_t(4), int64_t(5), int64_t(8), int64_t(9), int64_t(16),
                      int64_t(20)}) {
      const auto x = random_bf16(size_t(T * c.hidden), 74 + uint32_t(T));
      const TokenRows rows = token_rows(*gpu, T, 64);
      const DeviceBuffer &p = rows.positions, &s = rows.slots;
      const KvGeometry g{4, 16, c.kv_heads, c.head_dim};
      DevTensor xt = upload(*gpu, x, T, c.hidden);
      std::vector<float> q_out[2];
      std::vector<uint16_t> pools[2][2];
      for (int fused = 0; fused < 2; ++fused) {
        KvLayer kv = gpu->alloc_kv_layer(g);
        DevTensor qt = zeros(*gpu, T, qw), kt = zeros(*gpu, T, kw), vt = zeros(*gpu, T, kw);
        const auto* pp = static_cast<const int32_t*>(p.data());
        const auto* sp = static_cast<const int64_t*>(s.data());
        if (fused)
          gpu->qkv_rope_kv_write(xt.t, *gq, *gk, *gv, qt.t, kt.t, vt.t, pp, rp, sp, kv, g);
        else
          gpu->Backend::qkv_rope_kv_write(xt.t, *gq, *gk, *gv, qt.t, kt.t, vt.t, pp, rp, sp, kv, g);
        q_out[fused] = download(*gpu, qt.t);
        const int64_t elems = g.num_blocks * g.block_size * kw;
        for (int i = 0; i < 2; ++i) {
          pools[fused][i].resize(size_t(elems));
          gpu->copy_to_host(pools[fused][i].data(), (i == 0 ? kv.k : kv.v).data(), elems * 2);
        }
      }
      EXPECT_EQ(q_out[1], q_out[0]) << "q, head_dim " << c.head_dim << " rope_dim " << c.rope_dim << " T " << T;
      EXPECT_EQ(pools[1][0], pools[0][0]) << "K pool, head_dim " << c.head_dim << " rope_dim " << c.rope_dim
                                          << " T " << T;
      EXPECT_EQ(pools[1][1], pools[0][1]) << "V pool, head_dim " << c.head_dim << " T " << T;
      ++cases;
    }
  }
  std::printf("[qkv_rope_kv_write] %d cases bitwise equal to matmul_multi + rope_kv_write\n", cases);
}

// qkv_rope_kv_write at 17..256 rows with the q/k/v weights uploaded as one
// group (back to back): the CUDA backend computes one GEMM of the stacked
// weights and the rope + KV write kernel reads its rows. Against the Backend
// default (separate products, then rope_kv_write): q and both pools within
// bf16 rounding (the products' sums may be ordered differently), for GQA, MHA
// and partial rope of both styles; 257 rows take the default. Where the build
// has CUTLASS, 17..64 rows with interleaved rope go through its product with
// rope and the KV write in the epilogue (all of those rows here, with the
// step's angles prepared, except 20 rows, whose angles are prepared for 19).
// The stacked GEMMs and the fused epilogues are counted, so a silent fallback fails.
TEST(CudaFusedOps, StackedQkvRopeKvWriteMatchesSeparateProducts) {
  SERVAL_CUDA_OR_SKIP(gpu);
#ifdef SERVAL_WITH_CUDA
  const bool cutlass = cuda::use_cutlass_gemm(*gpu, true);
  cuda::use_cutlass_rope_epilogue(*gpu, true);
#endif
  struct Case { RopeStyle style; int32_t head_dim, rope_dim, q_heads, kv_heads; int64_t hidden; };
  double worst = 0;
  for (const Case& c : {Case{RopeStyle::Neox, 128, 128, 8, 2, 1024}, Case{RopeStyle::Interleaved, 128, 128, 4, 4, 512},
                        Case{RopeStyle::Neox, 64, 32, 8, 2, 512}, Case{RopeStyle::Interleaved, 128, 128, 8, 2, 1024},
                        Case{RopeStyle::Interleaved, 64, 32, 8, 2, 512}}) {
    const DeviceRope rope = device_rope(*gpu, c.style, c.head_dim, c.rope_dim);
    const int64_t qw = int64_t(c.q_heads) * c.head_dim, kw = int64_t(c.kv_heads) * c.head_dim;
    const auto wq = random_bf16(size_t(qw * c.hidden), 81, 0.05f), wk = random_bf16(size_t(kw * c.hidden), 82, 0.05f),
               wv = random_bf16(size_t(kw * c.hidden), 83, 0.05f);
    const auto group = gpu->upload_weight_group(
        {TensorView{"wq", DType::F32, {qw, c.hidden}, wq.data(), int64_t(wq.size() * 4)},
         TensorView{"wk", DType::F32, {kw, c.hidden}, wk.data(), int64_t(wk.size() * 4)},
         TensorView{"wv", DType::F32, {kw, c.hidden}, wv.data(), int64_t(wv.size() * 4)}});
    for (int64_t T : {int64_t(17), int64_t(20), int64_t(32), int64_t(33), int64_t(47), int64_t(48), int64_t(64),
                      int64_t(200), int64_t(256), int64_t(257)}) {
      const auto x = random_bf16(size_t(T * c.hidden), 84 + uint32_t(T));
      const TokenRows rows = token_rows(*gpu, T, 512);
      const DeviceBuffer &p = rows.positions, &s = rows.slots;
      const KvGeometry g{32, 16, c.kv_heads, c.head_dim};
      DevTensor xt = upload(*gpu, x, T, c.hidden);
      std::vector<float> q_out[2], pools[2][2];
      int64_t stacked = 0, fused = 0;
      for (int mine = 0; mine < 2; ++mine) {
        KvLayer kv = gpu->alloc_kv_layer(g);
        DevTensor qt = zeros(*gpu, T, qw), kt = zeros(*gpu, T, kw), vt = zeros(*gpu, T, kw);
        const auto* pp = static_cast<const int32_t*>(p.data());
        const auto* sp = static_cast<const int64_t*>(s.data());
#ifdef SERVAL_WITH_CUDA
        const int64_t before = cuda::stacked_qkv_calls(*gpu), fused_before = cuda::cutlass_epilogue_calls(*gpu);
#endif
        if (mine) {
          // The epilogue takes only the angles made for these positions; made
          // for one token fewer (a stale table), it must leave them alone.
          gpu->prepare_rope_angles(pp, T - (T == 20 ? 1 : 0), rope.params);
          gpu->qkv_rope_kv_write(xt.t, *group[0], *group[1], *group[2], qt.t, kt.t, vt.t, pp, rope.params, sp, kv, g);
        } else {
          gpu->Backend::qkv_rope_kv_write(xt.t, *group[0], *group[1], *group[2], qt.t, kt.t, vt.t, pp, rope.params,
                                          sp, kv, g);
        }
#ifdef SERVAL_WITH_CUDA
        if (mine) stacked = cuda::stacked_qkv_calls(*gpu) - before;
        if (mine) fused = cuda::cutlass_epilogue_calls(*gpu) - fused_before;
#endif
        q_out[mine] = download(*gpu, qt.t);
        const int64_t elems = g.num_blocks * g.block_size * kw;
        for (int i = 0; i < 2; ++i) {
          std::vector<uint16_t> bits(static_cast<size_t>(elems));
          gpu->copy_to_host(bits.data(), (i == 0 ? kv.k : kv.v).data(), elems * 2);
          for (uint16_t b : bits) pools[mine][i].push_back(bf16_to_f32(b));
        }
      }
      const double eq = max_rel_diff(q_out[1], q_out[0]), ek = max_rel_diff(pools[1][0], pools[0][0]),
                   ev = max_rel_diff(pools[1][1], pools[0][1]);
      EXPECT_LT(eq, 1e-2) << "q, head_dim " << c.head_dim << " kv_heads " << c.kv_heads << " T " << T;
      EXPECT_LT(ek, 1e-2) << "K pool, head_dim " << c.head_dim << " kv_heads " << c.kv_heads << " T " << T;
      EXPECT_LT(ev, 1e-2) << "V pool, head_dim " << c.head_dim << " kv_heads " << c.kv_heads << " T " << T;
#ifdef SERVAL_WITH_CUDA
      EXPECT_EQ(stacked, T <= 256 ? 1 : 0) << "stacked GEMMs at T " << T;
      EXPECT_EQ(fused, cutlass && c.style == RopeStyle::Interleaved && T <= 64 && T != 20 ? 1 : 0)
          << "fused epilogues at T " << T << ", head_dim " << c.head_dim;
#endif
      worst = std::max({worst, eq, ek, ev});
    }
  }
  std::printf("[stacked q/k/v] worst relative difference vs separate products %.2e\n", worst);
}

// residual += x @ W^T; out = rmsnorm(residual) * w, against the CPU backend's
// matmul then add_rmsnorm. 129..256 rows with 256-multiple k: the CUDA backend
// splits k in two halves (a batched cuBLASLt call into f32 partials, summed in
// the norm kernel); 17..64 rows too, as one CUTLASS launch where the build has
// CUTLASS (all of those rows here; counted); other rows, or other k: its plain path.
TEST(CudaFusedOps, MatmulAddRmsnormMatchesCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
#ifdef SERVAL_WITH_CUDA
  const bool cutlass = cuda::use_cutlass_gemm(*gpu, true);
#endif
  auto cpu = create_backend("cpu", 0);
  struct Case { int64_t rows, in, out; };
  for (const Case& c : {Case{160, 1024, 512}, Case{200, 2816, 256}, Case{129, 512, 1024}, Case{128, 1024, 512},
                        Case{256, 1024, 512}, Case{257, 1024, 512}, Case{64, 1024, 512}, Case{16, 1024, 512}, Case{160, 1000, 512},
                        Case{32, 1024, 512}, Case{40, 2816, 1024}, Case{64, 4096, 4096}}) {
    std::vector<float> x0(size_t(c.rows * c.out));
    std::mt19937 rng{uint32_t(c.in)};
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    for (float& f : x0) f = dist(rng);
    const auto a = random_bf16(size_t(c.rows * c.in), 61), wm = random_bf16(size_t(c.out * c.in), 62, 0.05f);
    const auto wn = random_bf16(size_t(c.out), 63);
    auto m_c = weight(*cpu, "w", {c.out, c.in}, wm), m_g = weight(*gpu, "w", {c.out, c.in}, wm);
    auto n_c = weight(*cpu, "norm", {c.out}, wn), n_g = weight(*gpu, "norm", {c.out}, wn);
    DevTensor a_c = upload(*cpu, a, c.rows, c.in), a_g = upload(*gpu, a, c.rows, c.in);
    DevTensor r_c = upload_f32(*cpu, x0, c.rows, c.out), r_g = upload_f32(*gpu, x0, c.rows, c.out);
    DevTensor p_c = zeros(*cpu, c.rows, c.out), p_g = zeros(*gpu, c.rows, c.out);
    DevTensor o_c = zeros(*cpu, c.rows, c.out), o_g = zeros(*gpu, c.rows, c.out);
    cpu->matmul(a_c.t, *m_c, nullptr, p_c.t);
    cpu->add_rmsnorm(r_c.t, p_c.t, *n_c, 1e-5f, o_c.t);
#ifdef SERVAL_WITH_CUDA
    const int64_t cutlass_before = cuda::cutlass_gemm_calls(*gpu);
#endif
    NormedRows o_n = gpu->matmul_add_rmsnorm(a_g.t, *m_g, p_g.t, r_g.t, *n_g, 1e-5f, o_g.t);
    EXPECT_FALSE(o_n.deferred) << "a norm with its own weight, rows " << c.rows;
#ifdef SERVAL_WITH_CUDA
    if (cutlass) {
      EXPECT_EQ(cuda::cutlass_gemm_calls(*gpu) - cutlass_before, c.rows >= 17 && c.rows <= 64 ? 1 : 0)
          << "CUTLASS launches, rows " << c.rows;
    }
#endif
    // The product is rounded to bf16 on both sides before the add: the residual
    // differs by a bf16 rounding of the product at most.
    const double res = max_rel_diff(download(*gpu, r_g.t), download(*cpu, r_c.t));
    const double out = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(res, 5e-3) << "residual, rows " << c.rows << " in " << c.in;
    EXPECT_LT(out, 1e-2) << "normalized output, rows " << c.rows << " in " << c.in;
    std::printf("[matmul_add_rmsnorm] rows %ld in %ld out %ld: residual %.2e, output %.2e\n", long(c.rows),
                long(c.in), long(c.out), res, out);
  }
}

TEST(CudaFusedOps, RopeKvWriteEqualsRopeThenKvWrite) {
  SERVAL_CUDA_OR_SKIP(gpu);
  struct Case { RopeStyle style; int32_t head_dim, rope_dim, q_heads, kv_heads; };
  int cases = 0;
  for (const Case& c : {Case{RopeStyle::Neox, 128, 128, 32, 8}, Case{RopeStyle::Interleaved, 128, 128, 8, 8},
                        Case{RopeStyle::Neox, 64, 32, 12, 4}, Case{RopeStyle::Interleaved, 8, 8, 6, 2},
                        Case{RopeStyle::Neox, 6, 4, 3, 1}}) {
    const DeviceRope rope = device_rope(*gpu, c.style, c.head_dim, c.rope_dim);
    const RopeParams& rp = rope.params;
    const int64_t T = 7, qw = int64_t(c.q_heads) * c.head_dim, kw = int64_t(c.kv_heads) * c.head_dim;
    const std::vector<int32_t> pos = {0, 1, 2, 100, 4095, 17, 9000};
    const std::vector<int64_t> slots = {5, 0, 63, 17, 30, 31, 2};
    const auto q = random_bf16(size_t(T * qw), 31), k = random_bf16(size_t(T * kw), 32),
               v = random_bf16(size_t(T * kw), 33);
    DeviceBuffer p = upload_ints(*gpu, pos), s = upload_ints(*gpu, slots);
    KvGeometry g{4, 16, c.kv_heads, c.head_dim};
    std::vector<float> q_out[2];
    std::vector<uint16_t> pools[2][2];
    for (int fused = 0; fused < 2; ++fused) {
      KvLayer kv = gpu->alloc_kv_layer(g);
      DevTensor qt = upload(*gpu, q, T, qw), kt = upload(*gpu, k, T, kw), vt = upload(*gpu, v, T, kw);
      if (fused) {
        gpu->rope_kv_write(qt.t, kt.t, vt.t, static_cast<int32_t*>(p.data()), rp, static_cast<int64_t*>(s.data()),
                           kv, g);
      } else {
        gpu->rope(qt.t, kt.t, static_cast<int32_t*>(p.data()), rp);
        gpu->kv_write(kt.t, vt.t, static_cast<int64_t*>(s.data()), kv, g);
      }
      q_out[fused] = download(*gpu, qt.t);
      const int64_t elems = g.num_blocks * g.block_size * kw;
      for (int i = 0; i < 2; ++i) {
        pools[fused][i].resize(size_t(elems));
        gpu->copy_to_host(pools[fused][i].data(), (i == 0 ? kv.k : kv.v).data(), elems * 2);
      }
    }
    EXPECT_EQ(q_out[1], q_out[0]) << "q, head_dim " << c.head_dim << " rope_dim " << c.rope_dim;
    EXPECT_EQ(pools[1][0], pools[0][0]) << "K pool, head_dim " << c.head_dim << " rope_dim " << c.rope_dim;
    EXPECT_EQ(pools[1][1], pools[0][1]) << "V pool, head_dim " << c.head_dim;
    ++cases;
  }
  std::printf("[rope_kv_write] %d cases bitwise equal to rope + kv_write\n", cases);
}

#ifdef SERVAL_WITH_CUDA  // the test counts the elided norms (cuda_stats.h)
// A KV pool (either backend's dtype) as floats.
std::vector<float> pool_values(Backend& be, const DeviceBuffer& pool, int64_t elems) {
  std::vector<float> out(static_cast<size_t>(elems));
  if (be.kv_dtype() == DType::F32) {
    be.copy_to_host(out.data(), pool.data(), elems * 4);
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(elems));
    be.copy_to_host(h.data(), pool.data(), elems * 2);
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  }
  return out;
}

// The RMSNorm left to the GEMV after it (cuda_norm_fold.cu): the norm's weight
// folded into gate/up and q/k/v, matmul_add_rmsnorm with a unit norm at up to
// 16 rows launches no norm kernel (it returns deferred rows) and
// gated_mlp_up / qkv_rope_kv_write scale their products. Against the CPU
// (add_rmsnorm with the weight, the unfolded weights): the residual,
// silu(gate) * up, q and both pools within bf16 rounding; the normalized x as
// read back after finish_norm; row 0 of 5, 9 and 16 rows bitwise as alone; 17
// rows take the norm kernel. The elided norms are counted, so a silent
// fallback fails.
TEST(CudaFusedOps, NormLeftToTheNextGemvMatchesCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  if (!gpu->folds_norm_weights()) GTEST_SKIP() << "norm folding is off (CudaTuning::norm_fold)";
  auto cpu = create_backend("cpu", 0);
  const int64_t H = 512, Q = 512, I = 1024, KW = 256, kMaxT = 17;
  const int32_t D = 64;
  const float eps = 1e-5f;
  const auto wo = random_bf16(size_t(H * Q), 81, 0.05f), gw = random_bf16(size_t(I * H), 82, 0.05f),
             uw = random_bf16(size_t(I * H), 83, 0.05f), wq = random_bf16(size_t(Q * H), 84, 0.05f),
             wk = random_bf16(size_t(KW * H), 85, 0.05f), wv = random_bf16(size_t(KW * H), 86, 0.05f);
  std::vector<float> g(static_cast<size_t>(H)), ones(static_cast<size_t>(H), 1.0f);
  for (int64_t i = 0; i < H; ++i) g[size_t(i)] = 0.25f + 0.003f * float(i % 500);
  struct Weights {
    std::unique_ptr<DeviceWeight> o, gate, up, q, k, v, norm;
  };
  auto weights = [&](Backend& be) {
    return Weights{weight(be, "wo", {H, Q}, wo), weight(be, "gate", {I, H}, gw), weight(be, "up", {I, H}, uw),
                   weight(be, "wq", {Q, H}, wq),  weight(be, "wk", {KW, H}, wk),  weight(be, "wv", {KW, H}, wv),
                   weight(be, "norm", {H}, g)};
  };
  Weights wc = weights(*cpu), wg = weights(*gpu);
  gpu->fold_norm_weight(*wg.norm, {wg.gate.get(), wg.up.get()});
  gpu->fold_norm_weight(*wg.norm, {wg.q.get(), wg.k.get(), wg.v.get()});
  auto unit = weight(*gpu, "unit_norm", {H}, ones);
  const DeviceRope rope_c = device_rope(*cpu, RopeStyle::Interleaved, D, D);
  const DeviceRope rope_g = device_rope(*gpu, RopeStyle::Interleaved, D, D);
  const KvGeometry geom{4, 16, int32_t(KW / D), D};

  // The rows of every T are the first T of these.
  const auto attn = random_bf16(size_t(kMaxT * Q), 87);
  std::vector<float> x0(size_t(kMaxT * H));
  std::mt19937 rng{88};
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (float& f : x0) f = dist(rng);

  std::vector<float> alone;  // silu(gate) * up of row 0 at T = 1
  int64_t elided = 0;
  const int64_t elided_before = cuda::elided_norms(*gpu);
  for (int64_t T : std::vector<int64_t>{1, 3, 4, 5, 8, 9, 16, 17}) {
    const std::vector<float> a(attn.begin(), attn.begin() + T * Q), x(x0.begin(), x0.begin() + T * H);
    const TokenRows rows_c = token_rows(*cpu, T, 64), rows_g = token_rows(*gpu, T, 64);
    // The CPU: the norm with its weight, then the unfolded weights.
    DevTensor a_c = upload(*cpu, a, T, Q), r_c = upload_f32(*cpu, x, T, H), p_c = zeros(*cpu, T, H),
              xn_c = zeros(*cpu, T, H), gb_c = zeros(*cpu, T, I), ub_c = zeros(*cpu, T, I),
              q_c = zeros(*cpu, T, Q), k_c = zeros(*cpu, T, KW), v_c = zeros(*cpu, T, KW);
    cpu->matmul(a_c.t, *wc.o, nullptr, p_c.t);
    cpu->add_rmsnorm(r_c.t, p_c.t, *wc.norm, eps, xn_c.t);
    cpu->gated_mlp_up(xn_c.t, *wc.gate, *wc.up, gb_c.t, ub_c.t, gb_c.t);
    KvLayer kv_c = cpu->alloc_kv_layer(geom);
    cpu->qkv_rope_kv_write(xn_c.t, *wc.q, *wc.k, *wc.v, q_c.t, k_c.t, v_c.t,
                           static_cast<const int32_t*>(rows_c.positions.data()), rope_c.params,
                           static_cast<const int64_t*>(rows_c.slots.data()), kv_c, geom);
    // The GPU, twice from the same residual: once into gate/up, once into q/k/v.
    DevTensor a_g = upload(*gpu, a, T, Q), p_g = zeros(*gpu, T, H), xn_g = zeros(*gpu, T, H),
              gb_g = zeros(*gpu, T, I), ub_g = zeros(*gpu, T, I), q_g = zeros(*gpu, T, Q), k_g = zeros(*gpu, T, KW),
              v_g = zeros(*gpu, T, KW);
    DevTensor r_g = upload_f32(*gpu, x, T, H);
    NormedRows xn_mlp = gpu->matmul_add_rmsnorm(a_g.t, *wg.o, p_g.t, r_g.t, *unit, eps, xn_g.t);
    EXPECT_EQ(xn_mlp.deferred, T <= 16) << "T " << T;
    gpu->gated_mlp_up(xn_mlp, *wg.gate, *wg.up, gb_g.t, ub_g.t, gb_g.t);
    const std::vector<float> res = download(*gpu, r_g.t), mlp = download(*gpu, gb_g.t);
    // The normalized x, read back: the rows times their 1 / rms, without the weight.
    const std::vector<float> xn = download(*gpu, gpu->finish_norm(xn_mlp)), xn_want = download(*cpu, xn_c.t);
    EXPECT_FALSE(xn_mlp.deferred);
    std::vector<float> xn_unweighted(xn_want.size());
    for (size_t i = 0; i < xn_want.size(); ++i) xn_unweighted[i] = xn_want[i] / g[i % size_t(H)];
    r_g = upload_f32(*gpu, x, T, H);
    KvLayer kv_g = gpu->alloc_kv_layer(geom);
    const NormedRows xn_qkv = gpu->matmul_add_rmsnorm(a_g.t, *wg.o, p_g.t, r_g.t, *unit, eps, xn_g.t);
    gpu->qkv_rope_kv_write(xn_qkv, *wg.q, *wg.k, *wg.v, q_g.t, k_g.t, v_g.t,
                           static_cast<const int32_t*>(rows_g.positions.data()), rope_g.params,
                           static_cast<const int64_t*>(rows_g.slots.data()), kv_g, geom);
    if (T <= 16) elided += 2;

    const int64_t pool = geom.num_blocks * geom.block_size * KW;
    const double e_res = max_rel_diff(res, download(*cpu, r_c.t)), e_xn = max_rel_diff(xn, xn_unweighted);
    const double e_mlp = max_rel_diff(mlp, download(*cpu, gb_c.t));
    const double e_q = max_rel_diff(download(*gpu, q_g.t), download(*cpu, q_c.t));
    const double e_k = max_rel_diff(pool_values(*gpu, kv_g.k, pool), pool_values(*cpu, kv_c.k, pool));
    const double e_v = max_rel_diff(pool_values(*gpu, kv_g.v, pool), pool_values(*cpu, kv_c.v, pool));
    EXPECT_LT(e_res, 5e-3) << "residual, T " << T;
    EXPECT_LT(e_xn, 1e-2) << "normalized x, T " << T;
    EXPECT_LT(e_mlp, 2e-2) << "silu(gate) * up, T " << T;
    EXPECT_LT(e_q, 2e-2) << "q, T " << T;
    EXPECT_LT(e_k, 2e-2) << "K pool, T " << T;
    EXPECT_LT(e_v, 2e-2) << "V pool, T " << T;
    std::printf("[norm in the GEMVs] T %ld: residual %.1e, x %.1e, mlp %.1e, q %.1e, K %.1e, V %.1e\n", long(T),
                e_res, e_xn, e_mlp, e_q, e_k, e_v);
    const std::vector<float> row0(mlp.begin(), mlp.begin() + I);
    if (T == 1) alone = row0;
    if (T == 5 || T == 9 || T == 16) {
      EXPECT_EQ(row0, alone) << "row 0 of " << T << " rows against alone";
    }
  }
  EXPECT_EQ(cuda::elided_norms(*gpu) - elided_before, elided);
}
#endif

}  // namespace
}  // namespace serval::testing
