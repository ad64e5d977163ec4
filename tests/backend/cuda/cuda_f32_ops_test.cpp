// The CUDA backend in float32 mode (create_backend(..., "float32"), --dtype
// float32): every op against the CPU backend on random f32 data (values bf16
// cannot hold, so a kernel that rounds through bf16 fails), to ~1e-5 relative
// or exactly where both sides do the same f32 arithmetic. Matmuls at 2e-5
// also rule out TF32 (~1e-3). Attention runs on shuffled block tables with
// GQA 1, 4 and 8, head_dim 8 to 256, decode and prefill rows (alone and mixed),
// and as a captured graph replayed while the contexts grow. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "cuda_test_util.h"
#include "runtime/rope.h"

namespace serval::testing {
namespace {

constexpr double kTol = 1e-5;
// Matmuls sum up to 11008 products in another order than OpenBLAS: the
// rounding differences grow with the length (worst here ~5e-6).
constexpr double kMatmulTol = 2e-5;

// The CUDA backend in float32 mode, or null without a CUDA build or device.
std::unique_ptr<Backend> try_cuda_f32() {
  if (!try_cuda_backend()) return nullptr;
  return create_backend("cuda", 0, "float32");
}

#define SERVAL_CUDA_F32_OR_SKIP(var)                          \
  std::unique_ptr<::serval::Backend> var = try_cuda_f32();    \
  if (!var) GTEST_SKIP() << "no CUDA backend in this build or no CUDA device here"

// n values ~ U(-scale, scale), full f32 precision.
std::vector<float> random_f32(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::unique_ptr<DeviceWeight> weight(Backend& be, const std::string& name, std::vector<int64_t> shape,
                                     const std::vector<float>& v) {
  return be.upload_weight(TensorView{name, DType::F32, std::move(shape), v.data(), int64_t(v.size() * 4)});
}

std::vector<float> pool_to_host(Backend& be, const DeviceBuffer& pool) {
  std::vector<float> h(size_t(pool.bytes() / 4));
  be.copy_to_host(h.data(), pool.data(), int64_t(h.size()) * 4);
  return h;
}

TEST(CudaF32Ops, DtypeSelection) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  EXPECT_EQ(gpu->act_dtype(), DType::F32);
  EXPECT_EQ(gpu->kv_dtype(), DType::F32);
  EXPECT_EQ(create_backend("cuda", 0)->act_dtype(), DType::BF16);
  EXPECT_EQ(create_backend("cuda", 0, "bfloat16")->kv_dtype(), DType::BF16);
}

TEST(CudaF32Ops, EmbeddingAndGatherRowsCopyExactly) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (int64_t H : {64, 36}) {  // 36: the element-wise path
    const int64_t V = 100, T = 9;
    const auto table = random_f32(size_t(V * H), 1);
    std::vector<int32_t> ids = {5, 0, 99, 5, 17, 42, 1, 98, 3};
    auto w_c = weight(*cpu, "emb", {V, H}, table), w_g = weight(*gpu, "emb", {V, H}, table);
    DeviceBuffer id_c = upload_ints(*cpu, ids), id_g = upload_ints(*gpu, ids);
    DevTensor o_c = zeros(*cpu, T, H), o_g = zeros(*gpu, T, H);
    cpu->embedding(*w_c, static_cast<int32_t*>(id_c.data()), {}, o_c.t);
    gpu->embedding(*w_g, static_cast<int32_t*>(id_g.data()), {}, o_g.t);
    const std::vector<float> got = download(*gpu, o_g.t);
    EXPECT_EQ(got, download(*cpu, o_c.t)) << "embedding, H " << H;
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + H),
              std::vector<float>(table.begin() + 5 * H, table.begin() + 6 * H))
        << "the table must be kept in f32";

    std::vector<int32_t> rows = {8, 0, 3};
    DeviceBuffer r_c = upload_ints(*cpu, rows), r_g = upload_ints(*gpu, rows);
    DevTensor g_c = zeros(*cpu, 3, H), g_g = zeros(*gpu, 3, H);
    cpu->gather_rows(o_c.t, static_cast<int32_t*>(r_c.data()), g_c.t);
    gpu->gather_rows(o_g.t, static_cast<int32_t*>(r_g.data()), g_g.t);
    EXPECT_EQ(download(*gpu, g_g.t), download(*cpu, g_c.t)) << "gather_rows, H " << H;
  }
}

TEST(CudaF32Ops, RmsNormAddRmsNormAndInPlaceNormMatchCpu) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  double worst = 0;
  for (int64_t cols : {8, 64, 172, 4096}) {
    const int64_t rows = 7;
    const auto x = random_f32(size_t(rows * cols), 2, 3.0f), d = random_f32(size_t(rows * cols), 3);
    const auto w = random_f32(size_t(cols), 4);
    auto w_c = weight(*cpu, "norm", {cols}, w), w_g = weight(*gpu, "norm", {cols}, w);
    DevTensor x_c = upload(*cpu, x, rows, cols), x_g = upload(*gpu, x, rows, cols);
    DevTensor o_c = zeros(*cpu, rows, cols), o_g = zeros(*gpu, rows, cols);
    cpu->rmsnorm(x_c.t, *w_c, 1e-5f, o_c.t);
    gpu->rmsnorm(x_g.t, *w_g, 1e-5f, o_g.t);
    const double rn = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(rn, kTol) << "rmsnorm cols " << cols;

    DevTensor d_c = upload(*cpu, d, rows, cols), d_g = upload(*gpu, d, rows, cols);
    cpu->add_rmsnorm(x_c.t, d_c.t, *w_c, 1e-5f, o_c.t);
    gpu->add_rmsnorm(x_g.t, d_g.t, *w_g, 1e-5f, o_g.t);
    EXPECT_EQ(download(*gpu, x_g.t), download(*cpu, x_c.t)) << "residual += delta, cols " << cols;
    const double arn = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(arn, kTol) << "add_rmsnorm cols " << cols;
    worst = std::max({worst, rn, arn});
  }
  // Per-head norm in place (qk_norm): [T, heads * 32] seen as [T * heads, 32].
  const int64_t T = 5, heads = 6, D = 32;
  const auto q = random_f32(size_t(T * heads * D), 5, 2.0f), w = random_f32(size_t(D), 6);
  auto w_c = weight(*cpu, "qn", {D}, w), w_g = weight(*gpu, "qn", {D}, w);
  DevTensor q_c = upload(*cpu, q, T, heads * D), q_g = upload(*gpu, q, T, heads * D);
  cpu->rmsnorm(q_c.t.reshaped(D), *w_c, 1e-6f, q_c.t.reshaped(D));
  gpu->rmsnorm(q_g.t.reshaped(D), *w_g, 1e-6f, q_g.t.reshaped(D));
  const double inplace = max_rel_diff(download(*gpu, q_g.t), download(*cpu, q_c.t));
  EXPECT_LT(inplace, kTol) << "in-place per-head rmsnorm";
  worst = std::max(worst, inplace);
  std::printf("[f32 ops] rmsnorm / add_rmsnorm / in-place norm: worst rel err %.2e\n", worst);
}

TEST(CudaF32Ops, AddAndSiluMulMatchCpu) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  double worst = 0;
  for (int64_t cols : {172, 11008}) {  // 3 x 172 = 516 values: the element-wise path
    const int64_t rows = 3;
    const auto a = random_f32(size_t(rows * cols), 5, 8.0f), b = random_f32(size_t(rows * cols), 6, 2.0f);
    DevTensor a_c = upload(*cpu, a, rows, cols), a_g = upload(*gpu, a, rows, cols);
    DevTensor b_c = upload(*cpu, b, rows, cols), b_g = upload(*gpu, b, rows, cols);
    DevTensor o_c = zeros(*cpu, rows, cols), o_g = zeros(*gpu, rows, cols);
    cpu->silu_mul(a_c.t, b_c.t, o_c.t);
    gpu->silu_mul(a_g.t, b_g.t, o_g.t);
    const double err = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(err, kTol) << "silu_mul cols " << cols;
    worst = std::max(worst, err);
    cpu->add(a_c.t, b_c.t);
    gpu->add(a_g.t, b_g.t);
    EXPECT_EQ(download(*gpu, a_g.t), download(*cpu, a_c.t)) << "add cols " << cols;
  }
  std::printf("[f32 ops] silu_mul: worst rel err %.2e\n", worst);
}

TEST(CudaF32Ops, MatmulMatchesCpuWithoutTf32) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  struct Shape { int64_t T, in, out; bool bias; };
  double worst = 0;
  for (const Shape& s : {Shape{1, 4096, 4096, false}, Shape{5, 64, 172, true}, Shape{16, 256, 512, false},
                         Shape{17, 256, 512, true}, Shape{77, 256, 512, false}, Shape{1, 128, 32000, false},
                         Shape{300, 512, 1024, true}, Shape{8, 11008, 256, false}, Shape{3, 4096, 1000, true},
                         Shape{9, 1024, 96, false}}) {
    const auto x = random_f32(size_t(s.T * s.in), 7), w = random_f32(size_t(s.out * s.in), 8, 0.05f);
    const auto b = random_f32(size_t(s.out), 9);
    auto w_c = weight(*cpu, "w", {s.out, s.in}, w), w_g = weight(*gpu, "w", {s.out, s.in}, w);
    auto b_c = weight(*cpu, "b", {s.out}, b), b_g = weight(*gpu, "b", {s.out}, b);
    DevTensor x_c = upload(*cpu, x, s.T, s.in), x_g = upload(*gpu, x, s.T, s.in);
    DevTensor y_c = zeros(*cpu, s.T, s.out), y_g = zeros(*gpu, s.T, s.out);
    cpu->matmul(x_c.t, *w_c, s.bias ? b_c.get() : nullptr, y_c.t);
    gpu->matmul(x_g.t, *w_g, s.bias ? b_g.get() : nullptr, y_g.t);
    const double err = max_rel_diff(download(*gpu, y_g.t), download(*cpu, y_c.t));
    EXPECT_LT(err, kMatmulTol) << "T " << s.T << " in " << s.in << " out " << s.out;
    worst = std::max(worst, err);
  }
  std::printf("[f32 ops] matmul (1..300 rows, in up to 11008): worst rel err %.2e\n", worst);
}

TEST(CudaF32Ops, MatmulMultiAndGatedMlpUpMatchCpu) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  double worst = 0;
  for (int64_t T : {1, 6, 20}) {
    const int64_t in = 512, inter = 768;
    const int64_t outs[3] = {512, 128, 128};
    const auto x = random_f32(size_t(T * in), 30);
    DevTensor x_c = upload(*cpu, x, T, in), x_g = upload(*gpu, x, T, in);
    std::vector<std::unique_ptr<DeviceWeight>> wc, wg;
    std::vector<const DeviceWeight*> pc, pg;
    std::vector<DevTensor> yc, yg;
    std::vector<Tensor> tc, tg;
    for (int i = 0; i < 3; ++i) {
      const auto w = random_f32(size_t(outs[i] * in), 31 + i, 0.05f);
      wc.push_back(weight(*cpu, "w", {outs[i], in}, w));
      wg.push_back(weight(*gpu, "w", {outs[i], in}, w));
      pc.push_back(wc.back().get());
      pg.push_back(wg.back().get());
      yc.push_back(zeros(*cpu, T, outs[i]));
      yg.push_back(zeros(*gpu, T, outs[i]));
      tc.push_back(yc.back().t);
      tg.push_back(yg.back().t);
    }
    cpu->matmul_multi(x_c.t, pc, tc);
    gpu->matmul_multi(x_g.t, pg, tg);
    for (int i = 0; i < 3; ++i) {
      const double err = max_rel_diff(download(*gpu, tg[size_t(i)]), download(*cpu, tc[size_t(i)]));
      EXPECT_LT(err, kMatmulTol) << "matmul_multi T " << T << " w " << i;
      worst = std::max(worst, err);
    }

    const auto gw = random_f32(size_t(inter * in), 40, 0.05f), uw = random_f32(size_t(inter * in), 41, 0.05f);
    auto g_c = weight(*cpu, "gate", {inter, in}, gw), g_g = weight(*gpu, "gate", {inter, in}, gw);
    auto u_c = weight(*cpu, "up", {inter, in}, uw), u_g = weight(*gpu, "up", {inter, in}, uw);
    DevTensor gb_c = zeros(*cpu, T, inter), ub_c = zeros(*cpu, T, inter), o_c = zeros(*cpu, T, inter);
    DevTensor gb_g = zeros(*gpu, T, inter), ub_g = zeros(*gpu, T, inter), o_g = zeros(*gpu, T, inter);
    cpu->gated_mlp_up(x_c.t, *g_c, *u_c, gb_c.t, ub_c.t, o_c.t);
    gpu->gated_mlp_up(x_g.t, *g_g, *u_g, gb_g.t, ub_g.t, o_g.t);
    const double err = max_rel_diff(download(*gpu, o_g.t), download(*cpu, o_c.t));
    EXPECT_LT(err, kMatmulTol) << "gated_mlp_up T " << T;
    worst = std::max(worst, err);
  }
  std::printf("[f32 ops] matmul_multi / gated_mlp_up: worst rel err %.2e\n", worst);
}

TEST(CudaF32Ops, RopeAndRopeKvWriteMatchCpu) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  double worst = 0;
  for (const RopeCase& c : rope_cases()) {
    const std::vector<float> inv = rope_case_inv_freq(c);
    const int64_t T = 6, qh = 4, kh = 2, row = kh * c.head_dim;
    const std::vector<int32_t> pos = {0, 1, 17, 511, 4095, 30000};
    const std::vector<int64_t> slots = {13, 0, 7, 2, 15, 9};  // of a 4 x 4 pool
    const KvGeometry g{4, 4, int32_t(kh), int32_t(c.head_dim)};
    const auto q = random_f32(size_t(T * qh * c.head_dim), 10), k = random_f32(size_t(T * row), 11);
    const auto v = random_f32(size_t(T * row), 12);
    // [backend][rope q, rope k, fused q, K pool, V pool]
    std::vector<float> r[2][5];
    int i = 0;
    for (Backend* be : {cpu.get(), gpu.get()}) {
      DeviceBuffer f = be->alloc(int64_t(inv.size() * 4));
      be->copy_to_device(f.data(), inv.data(), int64_t(inv.size() * 4));
      DeviceBuffer p = upload_ints(*be, pos), s = upload_ints(*be, slots);
      const RopeParams rp{c.style, int32_t(c.head_dim), int32_t(c.rope_dim), static_cast<const float*>(f.data())};
      DevTensor qt = upload(*be, q, T, qh * c.head_dim), kt = upload(*be, k, T, row);
      be->rope(qt.t, kt.t, static_cast<int32_t*>(p.data()), rp);
      r[i][0] = download(*be, qt.t);
      r[i][1] = download(*be, kt.t);
      // The fused op (the CPU's: rope, then kv_write) on fresh copies.
      DevTensor q2 = upload(*be, q, T, qh * c.head_dim), k2 = upload(*be, k, T, row), v2 = upload(*be, v, T, row);
      KvLayer kv = be->alloc_kv_layer(g);
      be->rope_kv_write(q2.t, k2.t, v2.t, static_cast<int32_t*>(p.data()), rp, static_cast<int64_t*>(s.data()), kv, g);
      r[i][2] = download(*be, q2.t);
      r[i][3] = pool_to_host(*be, kv.k);
      r[i][4] = pool_to_host(*be, kv.v);
      ++i;
    }
    const char* what[5] = {"rope q", "rope k", "rope_kv_write q", "rope_kv_write K pool", "rope_kv_write V pool"};
    for (int j = 0; j < 5; ++j) {
      ASSERT_EQ(r[1][j].size(), r[0][j].size()) << what[j];
      const double err = max_rel_diff(r[1][j], r[0][j]);
      EXPECT_LT(err, kTol) << what[j] << ", head_dim " << c.head_dim << " rope_dim " << c.rope_dim;
      worst = std::max(worst, err);
    }
    EXPECT_EQ(r[1][4], r[0][4]) << "V is copied exactly";
  }
  std::printf("[f32 ops] rope / rope_kv_write: worst rel err %.2e\n", worst);
}

TEST(CudaF32Ops, KvWriteAndCopyKvBlockAreExact) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (int32_t head_dim : {8, 128, 6}) {  // 6: the element-wise path
    const KvGeometry g{8, 4, 2, head_dim};
    const int64_t row = 2 * head_dim, T = 5;
    const std::vector<int64_t> slots = {31, 0, 6, 5, 17};
    const auto k = random_f32(size_t(T * row), 12), v = random_f32(size_t(T * row), 13);
    std::vector<float> pools[2][2];
    int i = 0;
    for (Backend* be : {cpu.get(), gpu.get()}) {
      KvLayer kv = be->alloc_kv_layer(g);
      DevTensor kt = upload(*be, k, T, row), vt = upload(*be, v, T, row);
      DeviceBuffer s = upload_ints(*be, slots);
      be->kv_write(kt.t, vt.t, static_cast<int64_t*>(s.data()), kv, g);
      be->copy_kv_block(kv, g, 1, 3);  // slots 4..7 -> 12..15
      pools[i][0] = pool_to_host(*be, kv.k);
      pools[i][1] = pool_to_host(*be, kv.v);
      ++i;
    }
    ASSERT_EQ(pools[1][0].size(), size_t(g.num_blocks * g.block_size * row)) << "f32 pools";
    EXPECT_EQ(pools[1][0], pools[0][0]) << "K pool, head_dim " << head_dim;
    EXPECT_EQ(pools[1][1], pools[0][1]) << "V pool, head_dim " << head_dim;
    EXPECT_EQ(pools[1][0][size_t(14 * row)], k[size_t(2 * row)]) << "slot 6 copied with block 1";
  }
}

// ---- paged attention ----

struct Seq {
  int32_t context;  // tokens in the cache after the step
  int32_t query;    // new tokens this step: the last `query` positions
};

struct AttnCase {
  std::string name;
  int32_t kv_heads, group, head_dim, block_size;
  std::vector<Seq> seqs;
};

// One backend's copy of a case: pools filled with random K/V through a
// block table shuffled the same way on every backend, random queries, and
// the batch arrays. `capacity` tokens per sequence are stored (>= context).
struct AttnWorld {
  int32_t num_heads = 0, num_tokens = 0;
  KvGeometry geom;
  KvLayer kv;
  DevTensor q, out;
  DeviceBuffer table, query_start, context_len, positions;
  BatchView view;
};

AttnWorld make_world(Backend& be, const AttnCase& c, int32_t capacity, uint32_t seed) {
  AttnWorld w;
  const int32_t S = int32_t(c.seqs.size());
  w.num_heads = c.kv_heads * c.group;
  const int64_t kv_row = int64_t(c.kv_heads) * c.head_dim;
  int32_t stride = 0;
  for (const Seq& s : c.seqs) {
    stride = std::max(stride, (std::max(capacity, s.context) + c.block_size - 1) / c.block_size);
    w.num_tokens += s.query;
  }
  w.geom = KvGeometry{int64_t(S) * stride + 3, c.block_size, c.kv_heads, c.head_dim};
  std::vector<int32_t> order(size_t(w.geom.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(size_t(S) * size_t(stride)), qstart = {0};
  std::vector<int64_t> slots;
  for (size_t i = 0; i < table.size(); ++i) table[i] = order[i];
  for (int32_t s = 0; s < S; ++s) {
    const int32_t* row = table.data() + size_t(s) * size_t(stride);
    for (int32_t j = 0; j < stride * c.block_size; ++j)
      slots.push_back(int64_t(row[j / c.block_size]) * c.block_size + j % c.block_size);
    qstart.push_back(qstart.back() + c.seqs[size_t(s)].query);
  }
  w.kv = be.alloc_kv_layer(w.geom);
  const int64_t n = int64_t(slots.size());
  DevTensor k = upload(be, random_f32(size_t(n * kv_row), seed + 1), n, kv_row);
  DevTensor v = upload(be, random_f32(size_t(n * kv_row), seed + 2), n, kv_row);
  DeviceBuffer sl = upload_ints(be, slots);
  be.kv_write(k.t, v.t, static_cast<int64_t*>(sl.data()), w.kv, w.geom);
  const int64_t q_cols = int64_t(w.num_heads) * c.head_dim;
  w.q = upload(be, random_f32(size_t(w.num_tokens * q_cols), seed + 3, 2.0f), w.num_tokens, q_cols);
  w.out = zeros(be, w.num_tokens, q_cols);
  w.table = upload_ints(be, table);
  w.query_start = upload_ints(be, qstart);
  w.context_len = upload_ints(be, std::vector<int32_t>(size_t(S), 0));
  w.positions = upload_ints(be, std::vector<int32_t>(size_t(w.num_tokens), 0));
  w.view.positions = static_cast<int32_t*>(w.positions.data());
  w.view.query_start = static_cast<int32_t*>(w.query_start.data());
  w.view.context_len = static_cast<int32_t*>(w.context_len.data());
  w.view.block_table = static_cast<int32_t*>(w.table.data());
  w.view.num_tokens = w.num_tokens;
  w.view.num_seqs = S;
  w.view.max_blocks_per_seq = stride;
  return w;
}

// Writes the step's contexts and positions in place (the query counts are the world's).
void set_step(Backend& be, AttnWorld& w, const std::vector<Seq>& seqs) {
  std::vector<int32_t> ctx, pos;
  int32_t max_q = 0, max_ctx = 0;
  for (const Seq& s : seqs) {
    for (int32_t j = s.context - s.query; j < s.context; ++j) pos.push_back(j);
    ctx.push_back(s.context);
    max_q = std::max(max_q, s.query);
    max_ctx = std::max(max_ctx, s.context);
  }
  be.copy_to_device(w.positions.data(), pos.data(), int64_t(pos.size()) * 4);
  be.copy_to_device(w.context_len.data(), ctx.data(), int64_t(ctx.size()) * 4);
  w.view.max_query_len = max_q;
  w.view.max_context_len = max_ctx;
}

void attend(Backend& be, AttnWorld& w, const AttnCase& c) {
  be.paged_attention(w.q.t, w.kv, w.geom, w.view, w.num_heads, 1.0f / std::sqrt(float(c.head_dim)), w.out.t);
}

// Fills out with a value attention cannot produce (|out| <= max |v| = 1).
void poison(Backend& be, const Tensor& t) {
  const std::vector<float> v(size_t(t.numel()), 100.0f);
  be.copy_to_device(t.data, v.data(), int64_t(v.size()) * 4);
}

std::vector<float> run_case(Backend& be, const AttnCase& c, uint32_t seed) {
  AttnWorld w = make_world(be, c, 0, seed);
  set_step(be, w, c.seqs);
  poison(be, w.out.t);
  attend(be, w, c);
  return download(be, w.out.t);
}

std::string case_name(const char* kind, int32_t head_dim, int32_t group, int32_t block_size) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s D%d G%d block %d", kind, head_dim, group, block_size);
  return buf;
}

std::vector<Seq> decodes(std::initializer_list<int32_t> contexts) {
  std::vector<Seq> out;
  for (int32_t c : contexts) out.push_back({c, 1});
  return out;
}

TEST(CudaF32Ops, PagedAttentionMatchesCpu) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  const std::vector<Seq> dec = decodes({1, 2, 17, 64, 65, 100, 1000, 2049});
  // A fresh prompt, chunks after a cached prefix (one of them ending off a
  // block boundary), a 2-token chunk, and a 1-token prompt.
  const std::vector<Seq> pre = {{300, 300}, {200, 37}, {130, 65}, {5, 2}, {1, 1}};
  const std::vector<Seq> mixed = {{513, 80}, {7, 1}, {40, 40}, {1500, 1}, {90, 3}, {1, 1}};
  std::vector<AttnCase> cases;
  for (int32_t D : {8, 64, 128})
    for (int32_t G : {1, 4}) {
      cases.push_back({case_name("decode", D, G, 16), 2, G, D, 16, dec});
      cases.push_back({case_name("prefill", D, G, 16), 2, G, D, 16, pre});
      cases.push_back({case_name("mixed", D, G, 16), 2, G, D, 16, mixed});
    }
  // The other compiled head dims, GQA 8 and other block sizes.
  for (int32_t D : {16, 32, 80, 96, 256}) cases.push_back({case_name("mixed", D, 8, 8), 1, 8, D, 8, mixed});
  cases.push_back({case_name("mixed", 64, 8, 32), 4, 8, 64, 32, mixed});
  uint32_t seed = 100;
  for (const AttnCase& c : cases) {
    const std::vector<float> want = run_case(*cpu, c, seed), got = run_case(*gpu, c, seed);
    const double err = worst_head_error(got, want, c.head_dim);
    std::printf("[f32 attn] %-28s: worst head rel err %.2e\n", c.name.c_str(), err);
    EXPECT_LT(err, kTol) << c.name;
    seed += 10;
  }
}

// Decode attention captured once in a graph and replayed while every context
// grows (as the runner's decode graphs are): the launch must not depend on
// the contexts.
TEST(CudaF32Ops, PagedAttentionGraphReplayFollowsGrowingContexts) {
  SERVAL_CUDA_F32_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  const AttnCase c{"graph", 2, 4, 64, 16, decodes({1, 30, 200, 999})};
  const int32_t capacity = 1200;  // the longest context reaches 999 + 175
  AttnWorld g = make_world(*gpu, c, capacity, 7), h = make_world(*cpu, c, capacity, 7);
  set_step(*gpu, g, c.seqs);
  attend(*gpu, g, c);  // eager first, as the runner does
  gpu->synchronize();
  gpu->begin_capture();
  attend(*gpu, g, c);
  std::unique_ptr<DeviceGraph> graph = gpu->end_capture();
  double worst = 0;
  std::vector<Seq> step = c.seqs;
  for (int i = 0; i < 5; ++i) {
    for (Seq& s : step) s.context += 1 + 17 * i;
    set_step(*gpu, g, step);
    set_step(*cpu, h, step);
    poison(*gpu, g.out.t);
    graph->replay();
    attend(*cpu, h, c);
    const double err = worst_head_error(download(*gpu, g.out.t), download(*cpu, h.out.t), c.head_dim);
    EXPECT_LT(err, kTol) << "replay " << i;
    worst = std::max(worst, err);
  }
  std::printf("[f32 attn] graph replays with growing contexts: worst head rel err %.2e\n", worst);
}

}  // namespace
}  // namespace serval::testing
