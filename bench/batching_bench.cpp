// Continuous batching against static batching (SchedulerConfig::static_batching:
// admit only when nothing is running), through the whole Engine on the CPU
// backend. Workload: 64 requests, short prompts of natural text, greedy,
// ignore_eos, output lengths uniform in 8..512 (fixed seed), at most 8
// sequences at once, a KV pool that holds 8 full requests (no preemption).
// Reported: output tokens/s (the rate counter) and forward steps.
//
// Models: stories260K (real weights; its 512-token context is raised to 1024
// so that prompt + 512 outputs fit: RoPE extends, and throughput does not
// depend on what the tokens mean) and a 15M-parameter Llama of random weights
// (stories15M's shape: dim 288, 6 layers, 6 heads, hidden 768, vocab 32000,
// tied embeddings), written once to $TMPDIR.
//
// Run: SERVAL_MODELS=... SERVAL_BENCH_THREADS=1 build/bench/batching_bench
// SERVAL_BENCH_THREADS sets the CPU threads (default 2). On a machine that
// other processes load, use 1: OpenMP workers spinning at the many small
// barriers of a step then wait for descheduled siblings, and the wall time
// measures the scheduler of the OS, not the engine.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "model/random_model.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

constexpr int kRequests = 64;
// Up to 8 rows a step's matmuls read each weight once for all rows
// (cpu_matmul.cpp's stream kernel), so every decode-only step of this
// workload takes that path. (docs/PERFORMANCE.md: on this CPU the step is compute-bound already at
// a few rows, so fewer, fuller steps save less than on a GPU.)
constexpr int kMaxSeqs = 8;
constexpr int64_t kContext = 1024;

struct BenchModel {
  LoadedModel model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ModelRunner> runner;
};

std::string random_model_path() {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/serval_bench_llama15m.gguf";
  if (!std::filesystem::exists(path)) {
    ModelConfig c;
    c.architecture = "llama";
    c.name = "random llama 15M (stories15M shape)";
    c.vocab_size = 32000;
    c.hidden_size = 288;
    c.intermediate_size = 768;
    c.num_layers = 6;
    c.num_heads = 6;
    c.num_kv_heads = 6;
    c.head_dim = 48;
    c.rope_dim = 48;
    c.max_position = kContext;
    c.rope_style = RopeStyle::Interleaved;
    c.tie_word_embeddings = true;
    c.validate();
    write_random_model(c, DType::F32, path + ".part", 1);
    std::filesystem::rename(path + ".part", path);
  }
  return path;
}

BenchModel& bench_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<BenchModel>> cache;
  auto& slot = cache[name];
  if (slot) return *slot;
  const std::string path = name == "stories260K" ? models_dir() + "/stories260K/stories260K.gguf"
                                                 : random_model_path();
  slot = std::make_unique<BenchModel>();
  slot->model = load_model(path);
  slot->tok = load_tokenizer(path);
  slot->model.config.max_position = kContext;
  RunnerOptions opts;
  const char* threads = std::getenv("SERVAL_BENCH_THREADS");
  opts.threads = threads ? std::atoi(threads) : 2;
  opts.kv_cache_tokens = kMaxSeqs * (kContext / 2 + 64);
  slot->runner = ModelRunner::create(slot->model.config, slot->model.weights, opts);
  return *slot;
}

// Counts forward steps, and holds the engine loop inside its first forward
// until release(): requests submitted meanwhile all reach the scheduler in
// the next step, so batches do not depend on how submission races the loop.
class GatedRunner : public ModelRunner {
 public:
  explicit GatedRunner(ModelRunner& inner) : inner_(inner) {}
  void forward(const Batch& batch, std::vector<float>& logits) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!entered_) {
        entered_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
      }
    }
    ++steps;
    inner_.forward(batch, logits);
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }
  const ModelConfig& config() const override { return inner_.config(); }
  int32_t block_size() const override { return inner_.block_size(); }
  int64_t num_blocks() const override { return inner_.num_blocks(); }
  std::atomic<int64_t> steps{0};

 private:
  ModelRunner& inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool entered_ = false, released_ = false;
};

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

std::vector<EngineRequest> workload(const Tokenizer& tok) {
  const std::vector<int32_t> text = tok.encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her dog. One day, she saw a big red ball under a tree and ran to get it.",
      true);
  std::mt19937 rng(42);
  std::vector<EngineRequest> out;
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    const size_t len = std::min(text.size(), size_t(4 + rng() % 29));
    r.prompt_ids.assign(text.begin(), text.begin() + long(len));
    r.params.temperature = 0.0f;
    r.stop.max_tokens = 8 + int32_t(rng() % 505);  // uniform in 8..512
    r.stop.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

void BM_Batching(benchmark::State& state, const std::string& name, bool static_batching) {
  BenchModel& m = bench_model(name);
  const std::vector<EngineRequest> requests = workload(*m.tok);
  int64_t tokens = 0, steps = 0;
  const double cpu_start = process_cpu_seconds();
  for (auto _ : state) {
    GatedRunner runner(*m.runner);
    EngineOptions opts;
    opts.scheduler.max_num_seqs = kMaxSeqs;
    opts.scheduler.max_num_batched_tokens = 2048;
    opts.scheduler.static_batching = static_batching;
    opts.enable_prefix_cache = false;  // the prompts share text: keep prefill equal in both modes
    Engine engine(runner, *m.tok, opts);
    // A one-token request whose step holds the loop while the workload is queued.
    EngineRequest gate = requests[0];
    gate.stop.max_tokens = 1;
    RequestHandle gate_handle = engine.submit(gate);
    runner.wait_entered();
    std::vector<RequestHandle> handles;
    for (const EngineRequest& r : requests) handles.push_back(engine.submit(r));
    runner.release();
    while (std::optional<RequestEvent> ev = gate_handle.next())
      if (ev->finished()) break;
    for (RequestHandle& h : handles)
      while (std::optional<RequestEvent> ev = h.next()) {
        tokens += int64_t(ev->token_ids.size());
        if (ev->finished()) break;
      }
    steps += runner.steps - 1;  // not the gate's step
  }
  const double cpu = process_cpu_seconds() - cpu_start;
  state.counters["out_tok_per_s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
  // The same per CPU second of the whole process (all threads): steadier than
  // the wall-clock rate when other processes share the cores.
  state.counters["out_tok_per_cpu_s"] = double(tokens) / cpu;
  state.counters["steps"] = double(steps) / double(state.iterations());
  state.counters["tokens"] = double(tokens) / double(state.iterations());
}

BENCHMARK_CAPTURE(BM_Batching, stories260K_continuous, std::string("stories260K"), false)
    ->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1);
BENCHMARK_CAPTURE(BM_Batching, stories260K_static, std::string("stories260K"), true)
    ->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1);
BENCHMARK_CAPTURE(BM_Batching, llama15M_random_continuous, std::string("llama15M"), false)
    ->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1);
BENCHMARK_CAPTURE(BM_Batching, llama15M_random_static, std::string("llama15M"), true)
    ->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1);

}  // namespace
}  // namespace serval

BENCHMARK_MAIN();
