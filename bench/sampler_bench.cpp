// Sampler cost per token for a Llama-3-sized vocabulary (128,256) with each
// filter, so the sampler's share of a decode step can be compared with the
// forward pass. Run: build/bench/sampler_bench
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "sampling/sampler.h"

namespace {

constexpr int kVocab = 128256;

std::vector<float> realistic_logits() {
  // A peaked head over a long, smooth tail, roughly like a language model's.
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i)
    logits[i] = float(std::sin(i * 0.001) * 4.0 + ((i * 2654435761u) % 1000) * 0.004);
  for (int i = 0; i < 20; ++i) logits[(i * 7919) % kVocab] = 14.0f - float(i) * 0.3f;
  return logits;
}

void run(benchmark::State& state, serval::SamplingParams params) {
  const std::vector<float> logits = realistic_logits();
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> output;
  serval::Sampler sampler;
  serval::Rng rng(1);
  for (auto _ : state) {
    const auto r = sampler.sample(logits, params, prompt, output, rng);
    benchmark::DoNotOptimize(r.token);
  }
  state.SetItemsProcessed(state.iterations());
}

serval::SamplingParams with(void (*set)(serval::SamplingParams&)) {
  serval::SamplingParams p;
  set(p);
  return p;
}

BENCHMARK_CAPTURE(run, greedy, with([](serval::SamplingParams& p) { p.temperature = 0; }));
BENCHMARK_CAPTURE(run, temperature, with([](serval::SamplingParams& p) { p.temperature = 0.8f; }));
BENCHMARK_CAPTURE(run, top_k_50, with([](serval::SamplingParams& p) { p.top_k = 50; }));
BENCHMARK_CAPTURE(run, top_p_0_9, with([](serval::SamplingParams& p) { p.top_p = 0.9f; }));
BENCHMARK_CAPTURE(run, top_p_0_99, with([](serval::SamplingParams& p) { p.top_p = 0.99f; }));
BENCHMARK_CAPTURE(run, min_p_0_05, with([](serval::SamplingParams& p) { p.min_p = 0.05f; }));
BENCHMARK_CAPTURE(run, penalties, with([](serval::SamplingParams& p) {
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.5f;
}));
BENCHMARK_CAPTURE(run, logprobs_5, with([](serval::SamplingParams& p) { p.logprobs = 5; }));

}  // namespace

BENCHMARK_MAIN();
