// CPU forward-pass throughput on random models of real shapes: decode (one
// token per step, bound by reading every weight once) and prefill (one GEMM
// over all prompt tokens). Run: build/bench/forward_bench [--benchmark_filter=...]
// SERVAL_BENCH_THREADS limits the threads (default: all cores).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>

#include "runtime/model_runner.h"

namespace serval {
namespace {

struct Shape {
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim;
  bool tied;
};

const std::map<std::string, Shape>& shapes() {
  static const std::map<std::string, Shape> s = {
      {"stories260K", {512, 64, 172, 5, 8, 4, 8, false}},
      {"llama-3.2-1b", {128256, 2048, 8192, 16, 32, 8, 64, true}},
  };
  return s;
}

// Weights are stored as bf16 (half the memory of f32 while building); the CPU
// runner converts them to f32, so the decode step reads f32 weights.
struct Model {
  ModelConfig cfg;
  WeightStore weights;
  std::unique_ptr<ModelRunner> runner;
  int64_t f32_weight_bytes = 0;
};

void add_random(Model& m, const std::string& name, std::vector<int64_t> shape, float center, float spread) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * 2);
  auto* h = reinterpret_cast<uint16_t*>(bytes.data());
  uint32_t state = uint32_t(std::hash<std::string>{}(name)) | 1u;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;  // LCG: fast, good enough for a benchmark
    const float u = float(state >> 8) / float(1u << 24) * 2.0f - 1.0f;
    h[i] = f32_to_bf16(center + spread * u);
  }
  m.weights.add_owned(name, DType::BF16, std::move(shape), std::move(bytes));
  m.f32_weight_bytes += n * 4;
}

Model& model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& slot = cache[name];
  if (slot) return *slot;
  cache.clear();  // one big model in memory at a time
  auto& m = *(cache[name] = std::make_unique<Model>());
  const Shape& s = shapes().at(name);
  ModelConfig& c = m.cfg;
  c.architecture = "llama";
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.rope_dim = s.head_dim;
  c.max_position = 4096;
  c.tie_word_embeddings = s.tied;
  const int64_t H = s.hidden;
  add_random(m, "token_embd.weight", {s.vocab, H}, 0, 1);
  add_random(m, "output_norm.weight", {H}, 1, 0.1f);
  if (!s.tied) add_random(m, "output.weight", {s.vocab, H}, 0, 0.1f);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const float w = 1.0f / float(H);
    add_random(m, p + "attn_norm.weight", {H}, 1, 0.1f);
    add_random(m, p + "attn_q.weight", {c.q_dim(), H}, 0, w);
    add_random(m, p + "attn_k.weight", {c.kv_dim(), H}, 0, w);
    add_random(m, p + "attn_v.weight", {c.kv_dim(), H}, 0, w);
    add_random(m, p + "attn_output.weight", {H, c.q_dim()}, 0, w);
    add_random(m, p + "ffn_norm.weight", {H}, 1, 0.1f);
    add_random(m, p + "ffn_gate.weight", {s.inter, H}, 0, w);
    add_random(m, p + "ffn_up.weight", {s.inter, H}, 0, w);
    add_random(m, p + "ffn_down.weight", {H, s.inter}, 0, 1.0f / float(s.inter));
  }
  RunnerOptions o;
  o.kv_cache_tokens = 2048;
  const char* t = std::getenv("SERVAL_BENCH_THREADS");
  o.threads = t ? std::atoi(t) : 0;
  m.runner = ModelRunner::create(c, m.weights, o);
  m.weights = WeightStore();  // the runner holds its own copy
  return m;
}

// One sequence: `n` new tokens after `cached` cached ones, logits for the last.
Batch make_batch(const ModelRunner& r, int32_t cached, int32_t n) {
  Batch b;
  const int32_t bs = r.block_size();
  b.max_blocks_per_seq = int32_t(r.num_blocks());
  for (int32_t i = 0; i < b.max_blocks_per_seq; ++i) b.block_table.push_back(i);
  for (int32_t p = cached; p < cached + n; ++p) {
    b.token_ids.push_back(p % 500 + 3);
    b.positions.push_back(p);
    b.slot_mapping.push_back(p);  // blocks are contiguous: slot == position
  }
  (void)bs;
  b.query_start = {0, n};
  b.context_len = {cached + n};
  b.logits_rows = {n - 1};
  return b;
}

void BM_Decode(benchmark::State& state, const std::string& name) {
  Model& m = model(name);
  std::vector<float> logits;
  m.runner->forward(make_batch(*m.runner, 0, 64), logits);  // a 64-token context to attend to
  const Batch step = make_batch(*m.runner, 64, 1);
  for (auto _ : state) m.runner->forward(step, logits);
  state.counters["tok/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(double(state.iterations()) * double(m.f32_weight_bytes) / 1e9, benchmark::Counter::kIsRate);
}

void BM_Prefill(benchmark::State& state, const std::string& name) {
  Model& m = model(name);
  const int32_t n = int32_t(state.range(0));
  const Batch prompt = make_batch(*m.runner, 0, n);
  std::vector<float> logits;
  for (auto _ : state) m.runner->forward(prompt, logits);
  state.counters["tok/s"] = benchmark::Counter(double(state.iterations()) * n, benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Decode, stories260K, std::string("stories260K"))->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Prefill, stories260K, std::string("stories260K"))->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, llama_3_2_1b, std::string("llama-3.2-1b"))->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK_CAPTURE(BM_Prefill, llama_3_2_1b, std::string("llama-3.2-1b"))->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace
}  // namespace serval

BENCHMARK_MAIN();
