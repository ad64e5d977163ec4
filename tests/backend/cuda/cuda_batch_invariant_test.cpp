// Batch-invariant mode on the CUDA backend (Backend::set_batch_invariant,
// --batch-invariant): every matmul goes through the GEMV, more than 16 rows
// in groups of 16 (rows of a width it cannot read through a row-wise kernel),
// and every attention row through the prefill kernels. A
// row's result must be bitwise what it is alone (one row, the plain GEMV) in a
// batch of any size, and still correct; at the runner, a sequence's logits
// must not depend on the other sequences of its steps, on how its prompt is
// chunked (a one-token chunk included), or on graph padding. Skips without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda_test_util.h"
#include "runtime/model_runner.h"
#include "../../runtime/tiny_model.h"

namespace serval::testing {
namespace {

std::vector<float> row_of(const std::vector<float>& m, int64_t r, int64_t cols) {
  return std::vector<float>(m.begin() + r * cols, m.begin() + (r + 1) * cols);
}

std::unique_ptr<Backend> invariant(std::unique_ptr<Backend> be) {
  be->set_batch_invariant(true);
  return be;
}

// matmul (bf16 and f32 outputs), matmul_multi of three weights (one launch)
// and gated_mlp_up, for batches of 1 to 150 rows: correct against the double
// reference, and each row bitwise the row computed alone (the plain GEMV).
TEST(CudaBatchInvariant, MatmulRowsAreTheirAloneBitsInBatchesOfAnySize) {
  SERVAL_CUDA_OR_SKIP(plain);
  auto gpu = invariant(std::move(plain));
  struct Shape { int64_t in, out; };
  const std::vector<int64_t> sizes = {1, 2, 16, 17, 31, 64, 65, 150};
  const int64_t T_max = sizes.back();
  // 11000 outputs: 1375 units of 8, so the kernel takes 4 units a block (2
  // gated) up to 64 rows, with a last block of fewer; the others take 1 or 2.
  // 172 inputs (stories260K's down projection): not a multiple of 8, so rows
  // after the first are not 16-byte aligned and the row-wise kernel takes them.
  for (const Shape& s :
       {Shape{4096, 11000}, Shape{4096, 1000}, Shape{1000, 77}, Shape{64, 172}, Shape{172, 64}, Shape{20, 9}}) {
    const auto x = random_bf16(size_t(T_max * s.in), 300 + uint32_t(s.in));
    std::vector<std::vector<float>> w;
    std::vector<std::unique_ptr<DeviceWeight>> wg;
    for (int i = 0; i < 3; ++i) {
      w.push_back(random_bf16(size_t(s.out * s.in), 400 + uint32_t(i * 7 + s.out), 0.05f));
      std::string name = "w";
      name += std::to_string(i);  // (not "w" + temporary: GCC 12's -Wrestrict false positive)
      wg.push_back(upload_matrix(*gpu, name, s.out, s.in, w.back()));
    }
    const auto want = reference_matmul(x, T_max, w[0], s.out, s.in);
    DevTensor xg = upload(*gpu, x, T_max, s.in);
    // Each form of the product for rows [start, start + T): bf16 out, f32 out,
    // the three weights' outputs concatenated, silu(w0) * w1.
    enum Form { kBf16, kF32, kMulti, kGated };
    auto run = [&](Form f, int64_t start, int64_t T) {
      const Tensor xs = xg.t.rows_view(start, T);
      if (f == kF32) {
        DeviceBuffer buf = gpu->alloc(T * s.out * 4);
        const Tensor y{buf.data(), DType::F32, T, s.out};
        gpu->matmul(xs, *wg[0], nullptr, y);
        return download(*gpu, y);
      }
      if (f == kMulti) {
        DevTensor y0 = zeros(*gpu, T, s.out), y1 = zeros(*gpu, T, s.out), y2 = zeros(*gpu, T, s.out);
        gpu->matmul_multi(xs, {wg[0].get(), wg[1].get(), wg[2].get()}, {y0.t, y1.t, y2.t});
        std::vector<float> all = download(*gpu, y0.t);
        for (const DevTensor* y : {&y1, &y2}) {
          const std::vector<float> part = download(*gpu, y->t);
          all.insert(all.end(), part.begin(), part.end());
        }
        return all;
      }
      DevTensor y = zeros(*gpu, T, s.out);
      if (f == kGated) {
        DevTensor gb = zeros(*gpu, T, s.out), ub = zeros(*gpu, T, s.out);
        gpu->gated_mlp_up(xs, *wg[0], *wg[1], gb.t, ub.t, y.t);
      } else {
        gpu->matmul(xs, *wg[0], nullptr, y.t);
      }
      return download(*gpu, y.t);
    };
    for (Form f : {kBf16, kF32, kMulti, kGated}) {
      // Rows of a multi product: T rows of each weight, one weight after another.
      const int64_t parts = f == kMulti ? 3 : 1;
      for (int64_t T : sizes) {
        const std::vector<float> got = run(f, 0, T);
        if (f == kBf16 || f == kF32) {
          const std::vector<double> want_t(want.begin(), want.begin() + T * s.out);
          EXPECT_LT(rel_err(got, want_t, want_t.size()), f == kF32 ? 1e-4 : 5e-3) << "form " << f << " T " << T;
        }
        for (int64_t r : {int64_t(0), T / 2, T - 1}) {
          const std::vector<float> alone = run(f, r, 1);
          for (int64_t part = 0; part < parts; ++part)
            EXPECT_EQ(row_of(got, part * T + r, s.out), row_of(alone, part, s.out))
                << "form " << f << ", in " << s.in << " out " << s.out << ": row " << r << " of " << T
                << " (weight " << part << ") differs from the row alone";
        }
      }
    }
  }
}

TinySpec gqa_tensor_core_model() {  // head_dim 64: the tensor-core prefill kernel; interleaved rope in the GEMV
  TinySpec s;
  s.vocab = 4096, s.hidden = 512, s.inter = 1536, s.layers = 3, s.heads = 8, s.kv_heads = 2, s.head_dim = 64;
  s.style = RopeStyle::Interleaved;
  s.matrix_dtype = DType::BF16;
  s.seed = 21;
  return s;
}

TinySpec mha_simt_model() {  // head_dim 32: the CUDA-core prefill kernel; NeoX rope (its own kernel); biases
  TinySpec s;
  s.arch = "qwen2";
  s.vocab = 1000, s.hidden = 256, s.inter = 688, s.layers = 2, s.heads = 8, s.kv_heads = 8, s.head_dim = 32;
  s.style = RopeStyle::Neox;
  s.bias = true;
  s.matrix_dtype = DType::BF16;
  s.seed = 22;
  return s;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

// One target sequence (a 45-token prompt, then 6 given tokens), run alone
// (whole prefill, one-row decode steps) and among 19 others: its prompt in
// chunks of 10, 1, 20 and 14 tokens while the others prefill and decode
// (mixed steps of 20-40 rows), then decode steps of all 20 (graphs of 24
// rows). Its logits rows must be the same bits.
TEST(CudaBatchInvariant, RunnerLogitsOfASequenceDoNotDependOnItsBatch) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  for (const TinySpec& spec : {gqa_tensor_core_model(), mha_simt_model()}) {
    const ModelConfig cfg = tiny_config(spec);
    const WeightStore weights = tiny_weights(cfg, spec);
    auto make_runner = [&] {
      RunnerOptions o;
      o.device = "cuda";
      o.kv_cache_tokens = 8192;
      o.max_num_seqs = 64;
      o.max_num_batched_tokens = 2048;
      o.batch_invariant = true;
      return ModelRunner::create(cfg, weights, o);
    };
    const int64_t V = cfg.vocab_size;
    const std::vector<int32_t> prompt = random_tokens(45, 5, V), forced = random_tokens(6, 6, V);
    std::vector<int32_t> order(512);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));

    // Alone.
    std::vector<std::vector<float>> alone;
    {
      auto runner = make_runner();
      PagedSeqs seqs(runner->block_size(), order, 16);
      const int id = seqs.add_sequence();
      std::vector<float> logits;
      runner->forward(seqs.step({id}, {prompt}, false), logits);
      alone.push_back(logits);
      for (int32_t t : forced) {
        runner->forward(seqs.step({id}, {{t}}, false), logits);
        alone.push_back(logits);
      }
    }

    // Among others.
    auto runner = make_runner();
    std::vector<int32_t> reversed(order.rbegin(), order.rend());  // other blocks than alone's
    PagedSeqs seqs(runner->block_size(), reversed, 16);
    const int target = seqs.add_sequence();
    std::vector<int> others;
    std::vector<std::vector<int32_t>> other_prompts;
    for (int i = 0; i < 19; ++i) {
      others.push_back(seqs.add_sequence());
      other_prompts.push_back(random_tokens(3 + (i * 7) % 38, 100 + uint32_t(i), V));
    }
    std::vector<float> logits;
    runner->forward(seqs.step(others, other_prompts, false), logits);  // the others' prefill
    std::vector<std::vector<float>> together;
    int offset = 0;
    for (int chunk : {10, 1, 20, 14}) {  // the target's prefill, while the others decode
      std::vector<int> ids = others;
      std::vector<std::vector<int32_t>> chunks(others.size(), std::vector<int32_t>{17});
      ids.insert(ids.begin() + 7, target);
      chunks.insert(chunks.begin() + 7, std::vector<int32_t>(prompt.begin() + offset, prompt.begin() + offset + chunk));
      offset += chunk;
      runner->forward(seqs.step(ids, chunks, false), logits);
      if (offset == int(prompt.size())) together.push_back(row_of(logits, 7, V));
    }
    for (int32_t t : forced) {  // decode steps of all 20 (graph-replayed, padded to 24)
      std::vector<int> ids = others;
      std::vector<std::vector<int32_t>> chunks(others.size(), std::vector<int32_t>{23});
      ids.push_back(target);
      chunks.push_back({t});
      runner->forward(seqs.step(ids, chunks, false), logits);
      together.push_back(row_of(logits, int64_t(ids.size()) - 1, V));
    }
    ASSERT_EQ(together.size(), alone.size());
    int equal = 0;
    for (size_t i = 0; i < alone.size(); ++i) {
      equal += together[i] == alone[i];
      EXPECT_EQ(together[i], alone[i]) << "head_dim " << spec.head_dim << ": logits of step " << i
                                       << " differ (rel error " << rel_error(together[i], alone[i]) << ")";
    }
    EXPECT_GT(runner->graph_replays(), 0) << "the decode steps should replay graphs";
    std::printf("[batch invariant] head_dim %ld: %d of %zu steps' logits bitwise equal alone and batched; %lld "
                "graph replays\n",
                long(spec.head_dim), equal, alone.size(), (long long)runner->graph_replays());
  }
}

TEST(CudaBatchInvariant, Float32IsRefused) {
  auto f32 = try_cuda_backend();
  if (!f32) GTEST_SKIP() << "no CUDA backend in this build or no CUDA device here";
  f32 = create_backend("cuda", 0, "float32");
  EXPECT_THROW(f32->set_batch_invariant(true), Error);
}

}  // namespace
}  // namespace serval::testing
