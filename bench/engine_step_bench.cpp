// What one engine step costs the host: the whole Engine loop (scheduling,
// batch building, sampling specs, commit, detokenization, events, metrics)
// around a model runner that costs nothing (it answers every row at once). On
// a GPU the part of it outside a step (scheduling, batch building, commit) is
// time the device waits; publishing a step's events overlaps the next step.
// The 8B offline bench spent 2-3% of its wall time outside the runner before
// that overlap (diary session 21, docs/PERFORMANCE.md).
//
// Workload: N requests of 512 random prompt tokens, 256 greedy output tokens
// each (ignore_eos), all submitted at once, at most N running (second
// argument 1: async scheduling on, so each step is planned while the one
// before is in flight, its tokens fed; on a GPU that is the default); the client
// drains each request's events in turn, blocking (as a server's handler
// would). Reported: host microseconds per engine step (prefill and decode
// steps together), wall and CPU of the engine's threads, and per generated token.
//
// Run: SERVAL_MODELS=... build/bench/engine_step_bench (the tokenizer of
// llama-2-tiny-random; skips without it).
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

constexpr int32_t kPromptLen = 512, kOutputLen = 256, kVocab = 32000, kBlockSize = 16;

// Samples token 300 + (row + step) % 20000 for every row, instantly.
class FreeRunner : public ModelRunner {
 public:
  FreeRunner() {
    cfg_.vocab_size = kVocab;
    cfg_.max_position = 4096;
  }
  void forward(const Batch&, std::vector<float>&) override {}
  void forward_sample(const Batch&, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override {
    out.assign(specs.size(), SampleResult{});
    for (size_t i = 0; i < specs.size(); ++i) out[i].token = 300 + int32_t((i + size_t(steps)) % 20000);
    ++steps;
  }
  const ModelConfig& config() const override { return cfg_; }
  int32_t block_size() const override { return kBlockSize; }
  int64_t num_blocks() const override { return 1 << 16; }

  int64_t steps = 0;

 private:
  ModelConfig cfg_;
};

// User + system CPU seconds of the process (RUSAGE_SELF) or of the calling thread (RUSAGE_THREAD).
double cpu_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime);
}

std::unique_ptr<Tokenizer> tokenizer() {
  const char* env = std::getenv("SERVAL_MODELS");
  const std::filesystem::path path =
      std::filesystem::path(env ? env : "../shared/models") / "llama-2-tiny-random" / "llama-2-tiny-random.gguf";
  if (!std::filesystem::exists(path)) return nullptr;
  return load_tokenizer(path.string());
}

void BM_EngineHostStep(benchmark::State& state) {
  const auto tok = tokenizer();
  if (!tok) {
    state.SkipWithError("llama-2-tiny-random not found: set SERVAL_MODELS");
    return;
  }
  const int32_t n = int32_t(state.range(0));
  const bool async = state.range(1) != 0;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, kVocab - 1);
  int64_t steps = 0, tokens = 0;
  double seconds = 0, loop_cpu = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = cpu_seconds(RUSAGE_SELF) - cpu_seconds(RUSAGE_THREAD);
    FreeRunner runner;
    EngineOptions eo;
    eo.scheduler.max_num_seqs = n;
    eo.scheduler.max_num_batched_tokens = 2048;
    eo.async_scheduling = async ? EngineOptions::AsyncScheduling::kOn : EngineOptions::AsyncScheduling::kOff;
    Engine engine(runner, *tok, eo);
    std::vector<RequestHandle> handles;
    for (int32_t i = 0; i < n; ++i) {
      EngineRequest r;
      r.prompt_ids.resize(kPromptLen);
      for (int32_t& t : r.prompt_ids) t = token(rng);
      r.params.temperature = 0;
      r.stop.max_tokens = kOutputLen;
      r.stop.ignore_eos = true;
      handles.push_back(engine.submit(std::move(r)));
    }
    for (RequestHandle& h : handles)
      while (auto ev = h.next()) tokens += int64_t(ev->token_ids.size());
    engine.shutdown();  // the loop thread's CPU time is all in
    steps += runner.steps;
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    loop_cpu += cpu_seconds(RUSAGE_SELF) - cpu_seconds(RUSAGE_THREAD) - cpu0;
  }
  state.counters["us_per_step"] = seconds / double(steps) * 1e6;
  // CPU time of every thread but the reader's (the engine loop's, almost all):
  // steadier than the wall time when the two threads share few cores.
  state.counters["loop_cpu_us_per_step"] = loop_cpu / double(steps) * 1e6;
  state.counters["us_per_token"] = seconds / double(tokens) * 1e6;
  state.counters["steps"] = double(steps) / double(state.iterations());
}
BENCHMARK(BM_EngineHostStep)
    ->Args({64, 0})
    ->Args({256, 0})
    ->Args({256, 1})
    ->ArgNames({"seqs", "async"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace serval

BENCHMARK_MAIN();
