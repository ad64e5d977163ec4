// Tiny random Mistral-style models (a sliding window on every layer) on the
// CUDA backend against the CPU runner: a prompt longer than the window (whole,
// and in chunks that start mid-sequence), then decode steps well past it,
// each step's last-position logits compared (bf16 tolerance; f32 tighter) and
// the greedy tokens. Head dims 32 (the CUDA-core prefill kernel), 64 and 128
// (tensor cores), GQA 1 to 8, windows 1 to 24. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "../../runtime/tiny_model.h"
#include "cuda_test_util.h"
#include "runtime/model_runner.h"

namespace serval::testing {
namespace {

struct WindowCase {
  const char* name;
  TinySpec spec;
  int64_t window;
};

std::vector<WindowCase> window_cases() {
  std::vector<WindowCase> out;
  {
    TinySpec s;  // Mistral-7B's shape in miniature: GQA 4, head_dim 128
    s.arch = "mistral";
    s.vocab = 4096, s.hidden = 1024, s.inter = 1536, s.layers = 3, s.heads = 8, s.kv_heads = 2, s.head_dim = 128;
    s.matrix_dtype = DType::BF16;
    s.seed = 11;
    out.push_back({"mistral_like_gqa4_d128_w16", s, 16});
  }
  {
    TinySpec s;  // GQA 4, head_dim 64, interleaved rope
    s.arch = "mistral";
    s.vocab = 2000, s.hidden = 512, s.inter = 1024, s.layers = 2, s.heads = 8, s.kv_heads = 2, s.head_dim = 64;
    s.style = RopeStyle::Interleaved;
    s.matrix_dtype = DType::BF16;
    s.seed = 12;
    out.push_back({"mistral_like_gqa4_d64_w24", s, 24});
    out.push_back({"mistral_like_gqa4_d64_w1", s, 1});
  }
  {
    TinySpec s;  // MQA-like GQA 8, head_dim 32
    s.arch = "mistral";
    s.vocab = 1000, s.hidden = 256, s.inter = 512, s.layers = 2, s.heads = 8, s.kv_heads = 1, s.head_dim = 32;
    s.matrix_dtype = DType::BF16;
    s.seed = 13;
    out.push_back({"mistral_like_gqa8_d32_w7", s, 7});
  }
  return out;
}

struct Comparison {
  double worst = 0;  // worst relative logit error over the steps
  int agree = 0;     // steps whose greedy token equals the CPU's
  int steps = 0;
};

int32_t argmax(const std::vector<float>& row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// A 40-token prompt in chunks of `chunk` tokens (the CPU's logits compared
// after each), then 40 decode steps teacher-forced with the CPU's greedy tokens.
Comparison compare_with_cpu(const WindowCase& wc, const char* dtype, int chunk, bool batch_invariant = false) {
  ModelConfig cfg = tiny_config(wc.spec);
  cfg.sliding_window = wc.window;
  const WeightStore weights = tiny_weights(cfg, wc.spec);
  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (const char* dev : {"cpu", "cuda"}) {
    RunnerOptions opts;
    opts.device = dev;
    opts.dtype = dev == std::string("cpu") ? "auto" : dtype;
    opts.batch_invariant = dev != std::string("cpu") && batch_invariant;
    opts.kv_cache_tokens = 256;
    runners.push_back(ModelRunner::create(cfg, weights, opts));
  }
  std::vector<int32_t> blocks(size_t(runners[0]->num_blocks()));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = int32_t(blocks.size() - 1 - i);
  PagedSeqs seqs[2] = {PagedSeqs(16, blocks, 16), PagedSeqs(16, blocks, 16)};
  const int ids[2] = {seqs[0].add_sequence(), seqs[1].add_sequence()};
  std::mt19937 rng(wc.spec.seed);
  std::uniform_int_distribution<int32_t> tok(1, int32_t(cfg.vocab_size) - 1);
  std::vector<int32_t> prompt(40);
  for (int32_t& t : prompt) t = tok(rng);

  Comparison c;
  std::vector<float> logits[2];
  auto step = [&](const std::vector<int32_t>& tokens) {
    for (int b = 0; b < 2; ++b) runners[size_t(b)]->forward(seqs[b].step({ids[b]}, {tokens}, false), logits[b]);
    c.worst = std::max(c.worst, rel_error(logits[1], logits[0]));
    c.agree += argmax(logits[0]) == argmax(logits[1]);
    ++c.steps;
  };
  for (size_t i = 0; i < prompt.size(); i += size_t(chunk))
    step(std::vector<int32_t>(prompt.begin() + long(i),
                              prompt.begin() + long(std::min(prompt.size(), i + size_t(chunk)))));
  for (int i = 0; i < 40; ++i) step({argmax(logits[0])});
  return c;
}

void report(const WindowCase& wc, const char* mode, int chunk, const Comparison& c) {
  std::printf("[%s, %s, chunks of %d] worst logit rel error %.2e, greedy agreement %d/%d\n", wc.name, mode, chunk,
              c.worst, c.agree, c.steps);
}

// bf16 end to end against f32: the tolerance of CudaModel.RandomModelsAgreeWithCpu.
TEST(CudaModelWindow, MistralLikeModelsAgreeWithCpuPastTheWindow) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  for (const WindowCase& wc : window_cases())
    for (int chunk : {40, 13}) {
      const Comparison c = compare_with_cpu(wc, "bfloat16", chunk);
      report(wc, "bf16", chunk, c);
      EXPECT_LT(c.worst, 2e-2) << wc.name << " chunks of " << chunk;
      EXPECT_GE(c.agree, c.steps - 1) << wc.name << " chunks of " << chunk;
    }
}

TEST(CudaModelWindow, MistralLikeModelsInFloat32AgreeWithCpu) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  for (const WindowCase& wc : window_cases())
    for (int chunk : {40, 13}) {
      const Comparison c = compare_with_cpu(wc, "float32", chunk);
      report(wc, "f32", chunk, c);
      EXPECT_LT(c.worst, 1e-4) << wc.name << " chunks of " << chunk;
      EXPECT_EQ(c.agree, c.steps) << wc.name << " chunks of " << chunk;
    }
}

// Batch-invariant mode: the prefill kernels take the decode rows.
TEST(CudaModelWindow, MistralLikeModelsBatchInvariantAgreeWithCpu) {
  SERVAL_CUDA_OR_SKIP(probe);
  probe.reset();
  for (const WindowCase& wc : window_cases()) {
    const Comparison c = compare_with_cpu(wc, "bfloat16", 13, /*batch_invariant=*/true);
    report(wc, "bf16 batch-invariant", 13, c);
    EXPECT_LT(c.worst, 2e-2) << wc.name;
    EXPECT_GE(c.agree, c.steps - 1) << wc.name;
  }
}

}  // namespace
}  // namespace serval::testing
