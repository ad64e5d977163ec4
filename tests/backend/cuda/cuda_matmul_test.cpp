// The CUDA backend's matrix products against a double-precision reference on
// random bf16 data: the GEMV kernel (1..16 rows) on decode shapes of
// Llama-2-7B and Llama-3.1-8B and on odd sizes,
// matmul_multi, f32 logits, the fused gated_mlp_up, and cuBLASLt GEMMs for
// more rows (timed algorithm choice, the wide search of --gemm-search and its
// cache file, and a first use inside a graph capture).
// Also checks batch invariance: a row's output is bitwise the same alone or
// in a batch of 1..16 (GEMV); more rows go to CUTLASS's decode GEMM or
// cuBLASLt (cuda_matmul.cu says which), checked here against the reference.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "core/dtype.h"
#include "../../model/test_models.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif

namespace serval::testing {
namespace {

// The tests of cuBLASLt's paths (its strided batches, its algorithm search)
// at 17..64 rows, which CUTLASS's decode GEMM takes by default.
void use_cublaslt_to_64_rows(Backend& be) {
#ifdef SERVAL_WITH_CUDA
  cuda::use_cutlass_gemm(be, false);
#else
  (void)be;
#endif
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

Tensor f32_tensor(const DeviceBuffer& buf, int64_t rows, int64_t cols) {
  return Tensor{buf.data(), DType::F32, rows, cols};
}

// bf16 outputs carry one rounding (2^-9 relative); the accumulation is f32.
constexpr double kBf16Tol = 5e-3;
// f32 outputs: only the f32 sums (tensor-core accumulation) differ from the
// reference; far below a bf16 rounding, so a rounded output would fail.
constexpr double kF32Tol = 1e-4;
constexpr int64_t kMaxRows = 16;  // the GEMV's

TEST(CudaMatmul, GemvMatchesReferenceForEveryRowCountOnDecodeShapes) {
  SERVAL_CUDA_OR_SKIP(gpu);
  struct Shape { int64_t in, out; };
  // q/o and k/v (Llama-3), gate/up, down (both models), odd outputs and inputs
  // (out not a multiple of 8; in not a multiple of 32; in smaller than one batch).
  for (const Shape& s : {Shape{4096, 4096}, Shape{4096, 1024}, Shape{4096, 11008}, Shape{11008, 4096},
                         Shape{14336, 264}, Shape{4096, 1000}, Shape{11008, 1000}, Shape{1000, 77},
                         Shape{64, 172}, Shape{8, 9}}) {
    const auto x = random_bf16(size_t(kMaxRows * s.in), 100 + uint32_t(s.in));
    const auto w = random_bf16(size_t(s.out * s.in), 200 + uint32_t(s.out), 0.05f);
    const auto want = reference_matmul(x, kMaxRows, w, s.out, s.in);
    auto wg = upload_matrix(*gpu, "w", s.out, s.in, w);
    DevTensor xg = upload(*gpu, x, kMaxRows, s.in);
    double worst = 0;
    for (int64_t T = 1; T <= kMaxRows; ++T) {
      DevTensor y = zeros(*gpu, T, s.out);
      gpu->matmul(xg.t.rows_view(0, T), *wg, nullptr, y.t);
      const double err = rel_err(download(*gpu, y.t), want, size_t(T * s.out));
      worst = std::max(worst, err);
      EXPECT_LT(err, kBf16Tol) << "T " << T << " in " << s.in << " out " << s.out;
    }
    std::printf("[cuda_matmul] gemv in %ld out %ld, T 1..16: worst rel err %.2e\n", long(s.in), long(s.out), worst);
  }
}

TEST(CudaMatmul, GemvWritesF32LogitsForTheLmHead) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int64_t in = 4096, out = 32000;
  const auto x = random_bf16(size_t(kMaxRows * in), 11);
  const auto w = random_bf16(size_t(out * in), 12, 0.05f);
  const auto want = reference_matmul(x, kMaxRows, w, out, in);
  auto wg = upload_matrix(*gpu, "head", out, in, w);
  DevTensor xg = upload(*gpu, x, kMaxRows, in);
  double worst = 0;
  for (int64_t T : {1, 2, 5, 8, 9, 16}) {
    DeviceBuffer buf = gpu->alloc(T * out * 4);
    const Tensor y = f32_tensor(buf, T, out);
    gpu->matmul(xg.t.rows_view(0, T), *wg, nullptr, y);
    const double err = rel_err(download(*gpu, y), want, size_t(T * out));
    worst = std::max(worst, err);
    EXPECT_LT(err, kF32Tol) << "T " << T;
  }
  std::printf("[cuda_matmul] gemv f32 logits in %ld out %ld: worst rel err %.2e\n", long(in), long(out), worst);
}

TEST(CudaMatmul, GemvRowsAreBitwiseTheSameAloneAndInABatch) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (bool f32 : {false, true}) {
    const int64_t in = 11008, out = 1000;
    const auto x = random_bf16(size_t(kMaxRows * in), 13);
    const auto w = random_bf16(size_t(out * in), 14, 0.05f);
    auto wg = upload_matrix(*gpu, "w", out, in, w);
    DevTensor xg = upload(*gpu, x, kMaxRows, in);
    auto run = [&](int64_t start, int64_t T) {
      DeviceBuffer buf = gpu->alloc(T * out * 4);
      const Tensor y = f32 ? f32_tensor(buf, T, out) : Tensor{buf.data(), DType::BF16, T, out};
      gpu->matmul(xg.t.rows_view(start, T), *wg, nullptr, y);
      return download(*gpu, y);
    };
    std::vector<std::vector<float>> alone;
    for (int64_t r = 0; r < kMaxRows; ++r) alone.push_back(run(r, 1));
    int mismatched = 0;
    for (int64_t T : {2, 3, 8, 9, 16}) {
      const auto batch = run(0, T);
      for (int64_t r = 0; r < T; ++r) {
        const std::vector<float> row(batch.begin() + r * out, batch.begin() + (r + 1) * out);
        const bool same = row == alone[size_t(r)];
        mismatched += !same;
        EXPECT_TRUE(same) << (f32 ? "f32" : "bf16") << " row " << r << " of T " << T << " differs from T 1";
      }
    }
    std::printf("[cuda_matmul] gemv batch invariance (%s): %d rows of T 2..16 differ from T 1\n",
                f32 ? "f32" : "bf16", mismatched);
  }
}

TEST(CudaMatmul, MatmulMultiMatchesReferenceWithTwoAndThreeWeights) {
  SERVAL_CUDA_OR_SKIP(gpu);
  struct Case { int64_t in; std::vector<int64_t> outs; };
  // Llama-3 q/k/v, Llama-2 q/k/v, a gate/up pair, and odd sizes.
  for (const Case& c : {Case{4096, {4096, 1024, 1024}}, Case{4096, {4096, 4096, 4096}}, Case{2048, {2816, 2816}},
                        Case{1000, {1000, 77, 9}}}) {
    const auto x = random_bf16(size_t(kMaxRows * c.in), 21);
    DevTensor xg = upload(*gpu, x, kMaxRows, c.in);
    std::vector<std::vector<float>> ws;
    std::vector<std::vector<double>> wants;
    std::vector<std::unique_ptr<DeviceWeight>> wg;
    std::vector<const DeviceWeight*> wp;
    for (size_t i = 0; i < c.outs.size(); ++i) {
      ws.push_back(random_bf16(size_t(c.outs[i] * c.in), 22 + uint32_t(i), 0.05f));
      wants.push_back(reference_matmul(x, kMaxRows, ws.back(), c.outs[i], c.in));
      wg.push_back(upload_matrix(*gpu, "w", c.outs[i], c.in, ws.back()));
      wp.push_back(wg.back().get());
    }
    double worst = 0;
    for (int64_t T : {1, 4, 8, 13, 16}) {
      std::vector<DevTensor> fused, single;
      std::vector<Tensor> yp;
      for (int64_t o : c.outs) {
        fused.push_back(zeros(*gpu, T, o));
        single.push_back(zeros(*gpu, T, o));
        yp.push_back(fused.back().t);
      }
      gpu->matmul_multi(xg.t.rows_view(0, T), wp, yp);
      for (size_t i = 0; i < c.outs.size(); ++i) {
        const auto got = download(*gpu, fused[i].t);
        const double err = rel_err(got, wants[i], size_t(T * c.outs[i]));
        worst = std::max(worst, err);
        EXPECT_LT(err, kBf16Tol) << "T " << T << " weight " << i << " of " << c.outs.size();
        // One launch for all weights or one per weight: the same numbers.
        gpu->matmul(xg.t.rows_view(0, T), *wp[i], nullptr, single[i].t);
        EXPECT_EQ(got, download(*gpu, single[i].t)) << "T " << T << " weight " << i;
      }
    }
    std::printf("[cuda_matmul] matmul_multi in %ld, %zu weights: worst rel err %.2e\n", long(c.in), c.outs.size(),
                worst);
  }
}

// More than 64 rows go to cuBLASLt (17..64 too, CUTLASS off here). Weights uploaded as a group lie back to
// back; with outputs that do too, matmul_multi runs each run of equal shapes
// as one strided-batched GEMM (q/k/v of Llama-2, k/v of Llama-3, gate/up),
// and the results match the reference whether or not it could batch.
TEST(CudaMatmul, GroupedWeightsRunAsStridedBatchesAndMatchTheReference) {
  SERVAL_CUDA_OR_SKIP(gpu);
  use_cublaslt_to_64_rows(*gpu);
  struct Case { int64_t in; std::vector<int64_t> outs; int64_t batched; };  // batched: GEMMs that batch
  for (const Case& c : {Case{1024, {1024, 256, 256}, 1}, Case{1024, {1024, 1024, 1024}, 1},
                        Case{512, {1408, 1408}, 1}, Case{512, {700, 300}, 0}}) {
    constexpr int64_t kRows = 100;
    const auto x = random_bf16(size_t(kRows * c.in), 41);
    DevTensor xg = upload(*gpu, x, kRows, c.in);
    std::vector<std::vector<float>> ws;
    std::vector<TensorView> views;
    for (size_t i = 0; i < c.outs.size(); ++i) {
      ws.push_back(random_bf16(size_t(c.outs[i] * c.in), 42 + uint32_t(i), 0.05f));
      views.push_back(TensorView{"w", DType::F32, {c.outs[i], c.in}, ws.back().data(), int64_t(ws.back().size() * 4)});
    }
    const auto group = gpu->upload_weight_group(views);
    std::vector<const DeviceWeight*> wp;
    for (const auto& w : group) wp.push_back(w.get());
    for (int64_t T : {int64_t(49), int64_t(64), kRows}) {
      // Outputs back to back in one buffer (as the runner's workspace), then each its own.
      int64_t total = 0;
      for (int64_t o : c.outs) total += T * o;
      const DeviceBuffer joint = gpu->alloc(dtype_bytes(gpu->act_dtype(), total));
      std::vector<Tensor> packed, apart;
      std::vector<DevTensor> own;
      int64_t off = 0;
      for (int64_t o : c.outs) {
        packed.push_back(Tensor{static_cast<char*>(joint.data()) + dtype_bytes(gpu->act_dtype(), off),
                                gpu->act_dtype(), T, o});
        off += T * o;
        own.push_back(zeros(*gpu, T, o));
        apart.push_back(own.back().t);
      }
#ifdef SERVAL_WITH_CUDA
      const int64_t before = cuda::batched_gemm_calls(*gpu);
#endif
      gpu->matmul_multi(xg.t.rows_view(0, T), wp, packed);
#ifdef SERVAL_WITH_CUDA
      EXPECT_EQ(cuda::batched_gemm_calls(*gpu) - before, c.batched)
          << "in " << c.in << " weights " << c.outs.size() << " T " << T;
#endif
      gpu->matmul_multi(xg.t.rows_view(0, T), wp, apart);
      for (size_t i = 0; i < c.outs.size(); ++i) {
        const auto want = reference_matmul(x, T, ws[i], c.outs[i], c.in);
        EXPECT_LT(rel_err(download(*gpu, packed[i]), want, want.size()), kBf16Tol) << "T " << T << " weight " << i;
        EXPECT_LT(rel_err(download(*gpu, apart[i]), want, want.size()), kBf16Tol) << "T " << T << " weight " << i;
      }
    }
  }
}

TEST(CudaMatmul, GatedMlpUpMatchesReferenceFusedAndFallback) {
  SERVAL_CUDA_OR_SKIP(gpu);
  struct Case { int64_t hidden, ffn; std::vector<int64_t> rows; double tol; };
  // Up to 16 rows: the fused GEMV (one rounding, of the product). More: the
  // fallback (two GEMMs rounding gate and up to bf16, then silu_mul): up to
  // three roundings, hence the looser bound.
  for (const Case& c : {Case{4096, 11008, {1, 3, 8, 12, 16}, kBf16Tol}, Case{512, 1001, {1, 7, 9}, kBf16Tol},
                        Case{4096, 11008, {17, 25, 32, 40, 48}, 1e-2}, Case{512, 1001, {20, 29, 33}, 1e-2},
                        Case{1024, 2816, {96}, 1e-2}}) {
    const int64_t T_max = c.rows.back();
    const auto x = random_bf16(size_t(T_max * c.hidden), 31);
    const auto wgate = random_bf16(size_t(c.ffn * c.hidden), 32, 0.05f);
    const auto wup = random_bf16(size_t(c.ffn * c.hidden), 33, 0.05f);
    const auto g = reference_matmul(x, T_max, wgate, c.ffn, c.hidden), u = reference_matmul(x, T_max, wup, c.ffn, c.hidden);
    std::vector<double> want(g.size());
    for (size_t i = 0; i < g.size(); ++i) want[i] = silu(g[i]) * u[i];
    auto gate = upload_matrix(*gpu, "gate", c.ffn, c.hidden, wgate), up = upload_matrix(*gpu, "up", c.ffn, c.hidden, wup);
    DevTensor xg = upload(*gpu, x, T_max, c.hidden);
    double worst = 0;
    std::vector<float> alone;  // row 0 computed alone
    for (int64_t T : c.rows) {
      DevTensor gb = zeros(*gpu, T, c.ffn), ub = zeros(*gpu, T, c.ffn), out = zeros(*gpu, T, c.ffn);
      gpu->gated_mlp_up(xg.t.rows_view(0, T), *gate, *up, gb.t, ub.t, out.t);
      const auto got = download(*gpu, out.t);
      const double err = rel_err(got, want, size_t(T * c.ffn));
      worst = std::max(worst, err);
      EXPECT_LT(err, c.tol) << "T " << T << " hidden " << c.hidden << " ffn " << c.ffn;
      const std::vector<float> row0(got.begin(), got.begin() + c.ffn);
      if (T == 1) alone = row0;
      if (T <= kMaxRows && !alone.empty()) {
        EXPECT_EQ(row0, alone) << "row 0 of T " << T << " differs from T 1";
      }
    }
    std::printf("[cuda_matmul] gated_mlp_up hidden %ld ffn %ld, T %ld..%ld: worst rel err %.2e\n", long(c.hidden),
                long(c.ffn), long(c.rows.front()), long(T_max), worst);
  }
}

#ifdef SERVAL_WITH_CUDA
// gate and up uploaded as one interleaved pair (upload_gated_pair with
// use_interleaved_gate_up, cuda_gate_up_layout.cuh), a norm weight folded into
// them: gated_mlp_up against the double reference of the folded (bf16)
// matrices on every path: the GEMV reading the pair in place (1..16 rows),
// CUTLASS's product with silu(gate) * up in its epilogue (17..64 rows,
// counted; at 33-64 rows on the swapped kernel, in W tiles of 96 for an ffn
// of 11008, whose last tile is part zeros, and of 64 for 1024; not for an
// ffn of 1000, not a multiple of 32), the pair's product then
// silu_mul_interleaved (17..64 rows with CUTLASS off, 65..256 in scratch, 300
// in pieces through up_buf). matmul refuses half a pair.
TEST(CudaMatmul, GatedMlpUpOfAnInterleavedPairMatchesReference) {
  SERVAL_CUDA_OR_SKIP(gpu);
  cuda::use_interleaved_gate_up(*gpu, true);
  struct Case { int64_t hidden, ffn; std::vector<int64_t> rows; };
  for (const Case& c : {Case{4096, 11008, {1, 5, 16, 17, 20, 32, 33, 40, 48, 64, 65, 100, 256, 300}},
                        Case{512, 1000, {3, 24, 64, 130}}, Case{512, 1024, {24, 40, 64}}}) {
    const int64_t T_max = c.rows.back();
    const auto x = random_bf16(size_t(T_max * c.hidden), 41);
    auto wgate = random_bf16(size_t(c.ffn * c.hidden), 42, 0.05f), wup = random_bf16(size_t(c.ffn * c.hidden), 43, 0.05f);
    const auto norm = random_bf16(size_t(c.hidden), 44, 0.5f);
    std::vector<float> scale(norm.size());
    for (size_t i = 0; i < norm.size(); ++i) scale[i] = 1.0f + norm[i];
    const auto pair = gpu->upload_gated_pair(
        TensorView{"gate", DType::F32, {c.ffn, c.hidden}, wgate.data(), int64_t(wgate.size() * 4)},
        TensorView{"up", DType::F32, {c.ffn, c.hidden}, wup.data(), int64_t(wup.size() * 4)});
    const auto norm_w = gpu->upload_weight(TensorView{"norm", DType::F32, {c.hidden}, scale.data(), c.hidden * 4});
    gpu->fold_norm_weight(*norm_w, {pair[0].get(), pair[1].get()});
    for (auto* w : {&wgate, &wup})  // as the GPU folds: the f32 product rounded to bf16
      for (size_t i = 0; i < w->size(); ++i) (*w)[i] = bf16_to_f32(f32_to_bf16((*w)[i] * scale[i % size_t(c.hidden)]));
    const auto g = reference_matmul(x, T_max, wgate, c.ffn, c.hidden), u = reference_matmul(x, T_max, wup, c.ffn, c.hidden);
    std::vector<double> want(g.size());
    for (size_t i = 0; i < g.size(); ++i) want[i] = silu(g[i]) * u[i];
    DevTensor xg = upload(*gpu, x, T_max, c.hidden);
    for (const bool on : {true, false}) {
      const bool cutlass = cuda::use_cutlass_gemm(*gpu, on) && on;
      for (int64_t T : c.rows) {
        DevTensor gb = zeros(*gpu, T, c.ffn), ub = zeros(*gpu, T, c.ffn);
        const int64_t before = cuda::cutlass_epilogue_calls(*gpu);
        gpu->gated_mlp_up(xg.t.rows_view(0, T), *pair[0], *pair[1], gb.t, ub.t, gb.t);  // out = gate_buf, as the runner
        const bool fused = cutlass && T >= 17 && T <= 64 && c.ffn % 32 == 0;
        EXPECT_EQ(cuda::cutlass_epilogue_calls(*gpu) - before, fused ? 1 : 0) << "T " << T << " ffn " << c.ffn;
        // One rounding (GEMV, CUTLASS's epilogue), or three (gate and up rounded, then silu_mul).
        const double tol = T <= kMaxRows || fused ? kBf16Tol : 1e-2;
        EXPECT_LT(rel_err(download(*gpu, gb.t), want, size_t(T * c.ffn)), tol)
            << "T " << T << " ffn " << c.ffn << (cutlass ? ", CUTLASS" : ", no CUTLASS");
      }
    }
    DevTensor y = zeros(*gpu, 1, c.ffn);
    EXPECT_THROW(gpu->matmul(xg.t.rows_view(0, 1), *pair[0], nullptr, y.t), Error);
  }
}
#endif

struct GemmCase { int64_t T, in, out; bool f32; };

// y = x @ W^T through gpu.matmul on random bf16 data (seeds `seed`, `seed` + 1),
// twice: the first call chooses the algorithm, the second runs the kept plan.
// The result matches the reference, and both calls give the same bits.
void check_gemm_twice(Backend& gpu, const GemmCase& s, uint32_t seed, const char* label) {
  const auto x = random_bf16(size_t(s.T * s.in), seed);
  const auto w = random_bf16(size_t(s.out * s.in), seed + 1, 0.05f);
  const auto want = reference_matmul(x, s.T, w, s.out, s.in);
  auto wg = upload_matrix(gpu, "w", s.out, s.in, w);
  DevTensor xg = upload(gpu, x, s.T, s.in);
  DeviceBuffer buf = gpu.alloc(s.T * s.out * 4);
  const Tensor y{buf.data(), s.f32 ? DType::F32 : DType::BF16, s.T, s.out};
  gpu.matmul(xg.t, *wg, nullptr, y);
  const auto first = download(gpu, y);
  gpu.matmul(xg.t, *wg, nullptr, y);
  const auto second = download(gpu, y);
  const double err = rel_err(second, want, want.size());
  EXPECT_LT(err, s.f32 ? kF32Tol : kBf16Tol) << "T " << s.T << " in " << s.in << " out " << s.out;
  EXPECT_EQ(first, second) << "T " << s.T << " in " << s.in << " out " << s.out;
  std::printf("[cuda_matmul] %s T %ld in %ld out %ld%s: rel err %.2e\n", label, long(s.T), long(s.in), long(s.out),
              s.f32 ? " f32" : "", err);
}

TEST(CudaMatmul, GemmPathMatchesReferenceAndKeepsItsTimedAlgorithm) {
  SERVAL_CUDA_OR_SKIP(gpu);
  // 17..64 rows: CUTLASS's decode GEMM or cuBLASLt's (cuda_matmul.cu); more: cuBLASLt's.
  for (const GemmCase& s : {GemmCase{20, 4096, 4096, false}, GemmCase{48, 4096, 11008, false},
                            GemmCase{33, 4096, 32000, true}, GemmCase{65, 4096, 4096, false},
                            GemmCase{96, 4096, 11008, false}, GemmCase{128, 11008, 4096, false},
                            GemmCase{300, 4096, 1000, false}, GemmCase{300, 1024, 4096, false},
                            GemmCase{80, 4096, 3000, true}, GemmCase{97, 512, 77, false}})
    check_gemm_twice(*gpu, s, 41, "gemm");
}

// --gemm-search (Backend::set_gemm_search): a decode-sized shape (up to 256
// tokens) is searched once, and whatever configuration wins (split-K,
// another tile, a cluster shape) still computes the product; larger shapes keep
// the heuristic's candidates.
TEST(CudaMatmul, GemmSearchKeepsTheProductAndSearchesDecodeShapesOnly) {
  SERVAL_CUDA_OR_SKIP(gpu);
  use_cublaslt_to_64_rows(*gpu);
  gpu->set_gemm_search(true, "");
  struct Case { GemmCase shape; bool searched; };
  for (const Case& c : {Case{{64, 1024, 3072, false}, true}, Case{{32, 2048, 1024, false}, true},
                        Case{{24, 1024, 4000, true}, true}, Case{{256, 512, 1536, false}, true},
                        Case{{300, 512, 512, false}, false}}) {
#ifdef SERVAL_WITH_CUDA
    const int64_t before = cuda::gemm_searches(*gpu);
#endif
    check_gemm_twice(*gpu, c.shape, 61, "searched gemm");  // the first call searches
#ifdef SERVAL_WITH_CUDA
    EXPECT_EQ(cuda::gemm_searches(*gpu) - before, c.searched ? 1 : 0) << "T " << c.shape.T;
#endif
  }
}

// --gemm-search-cache: a first backend searches a product and writes its
// choice; a second backend (a later run) takes it from the file without
// searching and computes the same bits.
TEST(CudaMatmul, GemmSearchCacheSkipsTheSearchInALaterRun) {
  SERVAL_CUDA_OR_SKIP(gpu);
  ScratchDir dir;
  const std::string path = dir.file("gemm-search.txt");
  const int64_t T = 40, in = 1024, out = 2048;
  const auto x = random_bf16(size_t(T * in), 71);
  const auto w = random_bf16(size_t(out * in), 72, 0.05f);
  std::vector<std::vector<float>> got;
  for (int run = 0; run < 2; ++run) {
    std::unique_ptr<Backend> be = run == 0 ? std::move(gpu) : try_cuda_backend();
    use_cublaslt_to_64_rows(*be);
    be->set_gemm_search(false, path);  // the cache file implies the search
    auto wg = upload_matrix(*be, "w", out, in, w);
    DevTensor xg = upload(*be, x, T, in);
    DevTensor y = zeros(*be, T, out);
    be->matmul(xg.t, *wg, nullptr, y.t);
    got.push_back(download(*be, y.t));
#ifdef SERVAL_WITH_CUDA
    EXPECT_EQ(cuda::gemm_searches(*be), run == 0 ? 1 : 0) << "run " << run;
    EXPECT_EQ(cuda::gemm_search_cache_hits(*be), run == 0 ? 0 : 1) << "run " << run;
#endif
    EXPECT_TRUE(std::filesystem::exists(path)) << "run " << run;
  }
  EXPECT_EQ(got[0], got[1]);
  const auto want = reference_matmul(x, T, w, out, in);
  EXPECT_LT(rel_err(got[1], want, want.size()), kBf16Tol);
}

TEST(CudaMatmul, FirstUseInsideAGraphCaptureWorks) {
  SERVAL_CUDA_OR_SKIP(gpu);
  if (!gpu->supports_graphs()) GTEST_SKIP() << "no graphs";
  const int64_t in = 768, out = 1536;
  const auto w = random_bf16(size_t(out * in), 51, 0.05f), wu = random_bf16(size_t(out * in), 52, 0.05f);
  auto wg = upload_matrix(*gpu, "w", out, in, w), wug = upload_matrix(*gpu, "u", out, in, wu);
  // 3 rows: the GEMV; 23: CUTLASS's decode GEMM (cuBLASLt without it); 70: a token count no other test uses, so its
  // cuBLASLt plan is new here.
  for (int64_t T : {3, 23, 70}) {
    const auto x = random_bf16(size_t(T * in), 53);
    const auto want = reference_matmul(x, T, w, out, in), want_u = reference_matmul(x, T, wu, out, in);
    DevTensor xg = upload(*gpu, x, T, in);
    DevTensor y = zeros(*gpu, T, out), gb = zeros(*gpu, T, out), ub = zeros(*gpu, T, out),
              mlp = zeros(*gpu, T, out);
    gpu->begin_capture();
    gpu->matmul(xg.t, *wg, nullptr, y.t);
    gpu->gated_mlp_up(xg.t, *wg, *wug, gb.t, ub.t, mlp.t);
    auto graph = gpu->end_capture();
    graph->replay();
    const double err = rel_err(download(*gpu, y.t), want, want.size());
    std::vector<double> want_mlp(want.size());
    for (size_t i = 0; i < want.size(); ++i) want_mlp[i] = silu(want[i]) * want_u[i];
    const double err_mlp = rel_err(download(*gpu, mlp.t), want_mlp, want_mlp.size());
    EXPECT_LT(err, kBf16Tol) << "T " << T;
    EXPECT_LT(err_mlp, 1e-2) << "T " << T;
    std::printf("[cuda_matmul] captured first use, T %ld: matmul rel err %.2e, gated_mlp_up %.2e\n", long(T), err,
                err_mlp);
  }
}

}  // namespace
}  // namespace serval::testing
