// ModelRunner (CPU backend) against a naive double-precision reference on tiny
// random models covering every config flag: GQA, head_dim != hidden/heads, qkv
// bias, qk norm, tied embeddings, both RoPE styles, partial RoPE, llama3 and
// linear scaling, rope_freqs divisors, f16/bf16/q8_0/q4_0/q5_1/q4_k/q6_k weight storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "chained_decode.h"
#include "runtime/model_runner.h"
#include "tiny_model.h"

namespace serval::testing {
namespace {

struct Case {
  const char* name;
  TinySpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  {
    TinySpec s;  // Llama 3 style: GQA 4:2, head_dim 8, interleaved, llama3 scaling, f16 weights
    s.style = RopeStyle::Interleaved;
    s.scaling.type = RopeScaling::Type::Llama3;
    s.scaling.factor = 8;
    s.scaling.low_freq_factor = 1;
    s.scaling.high_freq_factor = 4;
    s.scaling.original_max_position = 64;  // puts the 4 frequencies in all three bands
    s.matrix_dtype = DType::F16;
    out.push_back({"llama3_gqa4to2_interleaved", s});
  }
  {
    TinySpec s;  // Qwen2 style: GQA 8:2, head_dim 16, qkv bias, tied embeddings, bf16 weights
    s.arch = "qwen2";
    s.hidden = 48;
    s.heads = 8;
    s.kv_heads = 2;
    s.head_dim = 16;
    s.bias = true;
    s.tied = true;
    s.matrix_dtype = DType::BF16;
    s.seed = 2;
    out.push_back({"qwen2_gqa8to2_bias_tied", s});
  }
  {
    TinySpec s;  // Qwen3 style: q/k norm, head_dim 16 with hidden 32 (q_dim 64), linear scaling
    s.arch = "qwen3";
    s.head_dim = 16;
    s.qk_norm = true;
    s.scaling.type = RopeScaling::Type::Linear;
    s.scaling.factor = 2;
    s.seed = 3;
    out.push_back({"qwen3_qknorm_linear", s});
  }
  {
    TinySpec s;  // partial Neox RoPE with per-dimension divisors (GGUF rope_freqs.weight)
    s.heads = 8;
    s.kv_heads = 2;
    s.rope_dim = 4;
    s.rope_freqs = true;
    s.layers = 2;
    s.seed = 4;
    out.push_back({"neox_partial_rope_freqs", s});
  }
  {
    TinySpec s;  // multi-head (no GQA), partial interleaved RoPE
    s.heads = 4;
    s.kv_heads = 4;
    s.head_dim = 16;
    s.hidden = 40;
    s.rope_dim = 8;
    s.style = RopeStyle::Interleaved;
    s.seed = 5;
    out.push_back({"mha_interleaved_partial", s});
  }
  for (DType dt : {DType::Q8_0, DType::Q4_0}) {
    TinySpec s;  // block-quantized weights (every input dimension a multiple of 32)
    s.inter = 64;
    s.matrix_dtype = dt;
    s.seed = 6;
    out.push_back({dt == DType::Q8_0 ? "q8_0_weights" : "q4_0_weights", s});
  }
  {
    TinySpec s;  // Q5_1: 32-element blocks with a min and fifth bits
    s.inter = 64;
    s.matrix_dtype = DType::Q5_1;
    s.seed = 7;
    out.push_back({"q5_1_weights", s});
  }
  for (DType dt : {DType::Q4_K, DType::Q6_K}) {
    TinySpec s;  // K-quant super-blocks: every input dimension a multiple of 256
    s.hidden = 256;
    s.inter = 256;
    s.head_dim = 64;
    s.layers = 2;
    s.matrix_dtype = dt;
    s.seed = 8;
    out.push_back({dt == DType::Q4_K ? "q4_k_weights" : "q6_k_weights", s});
  }
  return out;
}

class RunnerVsReference : public ::testing::TestWithParam<Case> {};

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// Prefill logits of every position, then 6 greedy decode steps, against the
// reference; `rope` is the order the runner must compute in.
void expect_runner_matches_reference(const TinySpec& spec, RopeStyle rope, RopePermute permute = RopePermute::Auto) {
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore weights = tiny_weights(cfg, spec);
  RunnerOptions opts;
  opts.rope_permute = permute;
  opts.block_size = 4;
  opts.kv_cache_tokens = 128;
  auto runner = ModelRunner::create(cfg, weights, opts);
  EXPECT_EQ(runner->rope_style(), rope);
  ASSERT_EQ(runner->block_size(), 4);
  ASSERT_EQ(runner->num_blocks(), 32);

  std::vector<int32_t> tokens = {1, 7, 30, 12, 60, 5, 5, 41, 9, 22, 33, 18, 2, 57, 44, 3, 29};
  std::vector<int32_t> blocks(32);
  for (int i = 0; i < 32; ++i) blocks[i] = 31 - i;  // physical order unlike logical
  PagedSeqs seqs(4, blocks, 8);
  const int s = seqs.add_sequence();

  // Prefill with logits for every position.
  std::vector<float> logits;
  runner->forward(seqs.step({s}, {tokens}, /*all_logits=*/true), logits);
  auto ref = reference_logits(cfg, weights, tokens);
  ASSERT_EQ(logits.size(), tokens.size() * size_t(cfg.vocab_size));
  for (size_t t = 0; t < tokens.size(); ++t) {
    std::vector<float> row(logits.begin() + t * cfg.vocab_size, logits.begin() + (t + 1) * cfg.vocab_size);
    EXPECT_LT(rel_error(row, ref[t]), 1e-4) << "prefill position " << t;
  }

  // Greedy decode steps, each checked against a full recompute of the reference.
  int32_t next = argmax(logits.data() + (tokens.size() - 1) * cfg.vocab_size, cfg.vocab_size);
  for (int step = 0; step < 6; ++step) {
    tokens.push_back(next);
    runner->forward(seqs.step({s}, {{next}}, false), logits);
    ASSERT_EQ(logits.size(), size_t(cfg.vocab_size));
    ref = reference_logits(cfg, weights, tokens);
    EXPECT_LT(rel_error(logits, ref.back()), 1e-4) << "decode step " << step;
    next = argmax(logits.data(), cfg.vocab_size);
  }
}

TEST_P(RunnerVsReference, PrefillAndDecodeMatchReference) {
  expect_runner_matches_reference(GetParam().spec, GetParam().spec.style);
}

// RopePermute::On: a Neox model's q/k weights, biases and q/k norms load
// permuted to adjacent pairs (as the CUDA backend asks for) and the runner
// rotates adjacent pairs: the reference's logits all the same.
TEST_P(RunnerVsReference, WithQkRowsPermutedToAdjacentPairsMatchesReference) {
  expect_runner_matches_reference(GetParam().spec, RopeStyle::Interleaved, RopePermute::On);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, RunnerVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// When every row of a step wants logits (a decode step), the last layer's
// projection goes into the residual and the final norm in one op; otherwise
// the rows are gathered and normed apart. Both give a row the same logits.
TEST(ModelRunner, LogitsOfEveryRowMatchThoseOfAGatheredRow) {
  const TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore weights = tiny_weights(cfg, spec);
  RunnerOptions opts;
  opts.block_size = 4;
  opts.kv_cache_tokens = 128;
  std::vector<float> every, one;
  for (const bool gathered : {false, true}) {
    auto runner = ModelRunner::create(cfg, weights, opts);
    std::vector<int32_t> blocks(32);
    for (int i = 0; i < 32; ++i) blocks[i] = i;
    PagedSeqs seqs(4, blocks, 8);
    const int a = seqs.add_sequence(), b = seqs.add_sequence();
    std::vector<float> logits;
    runner->forward(seqs.step({a, b}, {{1, 7, 30}, {12, 60}}, false), logits);
    Batch decode = seqs.step({a, b}, {{5}, {41}}, false);  // logits rows 0, 1: every row
    if (gathered) decode.logits_rows = {1};
    runner->forward(decode, gathered ? one : every);
  }
  const size_t V = size_t(cfg.vocab_size);
  ASSERT_EQ(every.size(), 2 * V);
  ASSERT_EQ(one.size(), V);
  std::vector<double> want(one.begin(), one.end());
  EXPECT_LT(rel_error(std::vector<float>(every.begin() + V, every.end()), want), 1e-6);
}

TEST(ModelRunner, MissingOrMisShapedTensorsFailWithTheirName) {
  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  WeightStore w = tiny_weights(cfg, spec);
  WeightStore partial;
  for (const auto& [name, view] : w.all())
    if (name != "blk.1.ffn_up.weight") partial.add(view);
  try {
    ModelRunner::create(cfg, partial, RunnerOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_up.weight"), std::string::npos) << e.what();
  }
  ModelConfig wrong = cfg;
  wrong.intermediate_size = 40;
  try {
    ModelRunner::create(wrong, w, RunnerOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ffn_gate.weight"), std::string::npos) << e.what();
  }
}

TEST(ModelRunner, RejectsUnknownDeviceAndBadTokens) {
  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  RunnerOptions opts;
  opts.device = "tpu";
  EXPECT_THROW(ModelRunner::create(cfg, w, opts), Error);

  auto runner = ModelRunner::create(cfg, w, RunnerOptions{});
  PagedSeqs seqs(runner->block_size(), {0, 1, 2}, 3);
  const int s = seqs.add_sequence();
  std::vector<float> logits;
  EXPECT_THROW(runner->forward(seqs.step({s}, {{1, int32_t(cfg.vocab_size)}}, false), logits), Error);
}

// Steps queued before the host has the tokens they continue from (fed on the
// device through Batch::token_source) give the tokens of steps taken one at a
// time, and a bad feed is refused before anything runs.
TEST(ModelRunner, ChainedStepsGiveTheTokensOfStepsTakenOneAtATime) {
  TinySpec spec;
  spec.vocab = 97;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {5}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}};
  RunnerOptions o;
  o.kv_cache_tokens = 512;
  auto one_at_a_time = ModelRunner::create(cfg, w, o);
  auto chained = ModelRunner::create(cfg, w, o);
  const auto want = greedy_decode(*one_at_a_time, prompts, 12, false);
  EXPECT_EQ(greedy_decode(*chained, prompts, 12, true), want);
  for (const auto& t : want) EXPECT_EQ(t.size(), 12u);
  // Penalties count the token fed from the step before (SampleSpec::fed_source).
  SamplingParams penalized = greedy_params();
  penalized.repetition_penalty = 0.5f;
  penalized.frequency_penalty = -2.0f;
  penalized.presence_penalty = 1.0f;
  const auto want_penalized = greedy_decode(*one_at_a_time, prompts, 12, false, penalized);
  EXPECT_EQ(greedy_decode(*chained, prompts, 12, true, penalized), want_penalized);
  EXPECT_NE(want_penalized, want) << "the penalties change nothing";

  PagedSeqs seqs(chained->block_size(), {0, 1, 2, 3}, 4);
  const int s = seqs.add_sequence();
  SamplingParams greedy;
  greedy.temperature = 0;
  SampleSpec one;
  one.params = &greedy;
  std::vector<SampleResult> out;
  chained->start_sample(seqs.step({s}, {{4, 5}}, false), {&one, 1});
  Batch next = seqs.step({s}, {{0}}, false);
  next.token_source = {1};  // the step before had one spec
  EXPECT_THROW(chained->start_sample(next, {&one, 1}), Error);
  next.token_source = {0};
  chained->start_sample(next, {&one, 1});
  EXPECT_THROW(chained->start_sample(seqs.step({s}, {{6}}, false), {&one, 1}), Error) << "a third unfinished step";
  EXPECT_THROW(chained->forward_sample(seqs.step({s}, {{6}}, false), {&one, 1}, out), Error);
  chained->finish_sample(out);
  chained->finish_sample(out);
  EXPECT_THROW(chained->finish_sample(out), Error);
}

TEST(ModelRunner, KvPoolSizeFromTokensOrBytes) {
  TinySpec spec;
  const ModelConfig cfg = tiny_config(spec);
  const WeightStore w = tiny_weights(cfg, spec);
  RunnerOptions opts;
  opts.block_size = 16;
  opts.kv_cache_tokens = 100;
  EXPECT_EQ(ModelRunner::create(cfg, w, opts)->num_blocks(), 7);  // ceil(100 / 16)
  opts.kv_cache_tokens = 0;
  // 2 (K, V) x 3 layers x 16 kv_dim x 4 bytes = 384 bytes per token.
  opts.kv_memory_bytes = 384 * 64;
  EXPECT_EQ(ModelRunner::create(cfg, w, opts)->num_blocks(), 4);
  opts.kv_memory_bytes = 384;
  EXPECT_THROW(ModelRunner::create(cfg, w, opts), Error);  // less than one block
}

// What the runner says it holds: the CPU converts every matrix to f32, and
// the matrix bytes (what a step streams) are those of f32.
TEST(ModelRunner, SaysWhichFormatsItHoldsTheMatricesIn) {
  for (bool tied : {false, true}) {
    TinySpec spec;
    spec.matrix_dtype = DType::Q8_0;
    spec.inter = 64;
    spec.tied = tied;
    const ModelConfig cfg = tiny_config(spec);
    const WeightStore w = tiny_weights(cfg, spec);
    RunnerOptions opts;
    opts.kv_cache_tokens = 64;
    const auto runner = ModelRunner::create(cfg, w, opts);
    EXPECT_EQ(runner->weight_formats(),
              tied ? "attention f32, MLP f32, LM head tied to the embedding" : "attention f32, MLP f32, LM head f32");
    const int64_t H = cfg.hidden_size, layer = H * (cfg.q_dim() + 2 * cfg.kv_dim()) + cfg.q_dim() * H +
                                             3 * H * cfg.intermediate_size;
    EXPECT_EQ(runner->matrix_bytes(), 4 * (layer * cfg.num_layers + (tied ? 0 : cfg.vocab_size * H)));
  }
}

}  // namespace
}  // namespace serval::testing
