#pragma once
// The options of `serval bench` and its four modes (each in cli/bench_<mode>.cpp):
//  runner     N random requests straight through the model runner: all prompts
//             prefilled, then every sequence decodes together (greedy, sampled
//             on the device); the whole run twice, the first a warm-up.
//  engine     offline throughput through the whole Engine (scheduler, chunked
//             prefill, prefix cache): N random requests or a JSONL file, all
//             submitted at once.
//  sweep      batched decode steps at batch sizes x context lengths over real
//             KV data.
//  attention  the decode attention kernel alone on the Backend API.
//  serve      a running OpenAI-compatible server under load, as its clients
//             see it: arrival rate, TTFT, TPOT, ITL, goodput.
// Every figure of the first four is also shown against its physical limit
// (cli/bench_cost.h).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cli/bench_cost.h"
#include "cli/engine_flags.h"

namespace serval::cli {

struct BenchOptions {
  std::string mode = "runner";
  std::string model;
  bool json = false;
  // runner: wait for each decode step's tokens before queueing the next (the
  // default queues step N + 1, fed from step N's tokens on the device, first).
  bool sync_steps = false;
  Limits limits;
  EngineFlags engine;

  // runner, engine and serve
  int32_t requests = 1, input_len = 128, output_len = 128;
  int32_t max_batch_tokens = 8192;  // runner: tokens per prefill step

  // engine and serve
  std::string input;          // JSONL requests (the format of generate --input)
  float temperature = 0;      // random requests, and the JSONL lines' default

  // serve
  std::string url = "http://127.0.0.1:8000";
  std::string endpoint = "completions";  // or chat (--input lines with "messages")
  double request_rate = std::numeric_limits<double>::infinity();  // requests a second (Poisson)
  int32_t max_concurrency = 0;  // 0: no limit
  uint32_t seed = 0;            // prompts and arrivals
  int32_t prefix_len = 0;       // random prompts: tokens they all start with
  double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput's limits (0: none)

  // engine
  int32_t warmup_requests = -1;  // -1: min(requests, max-num-seqs)

  // sweep and attention
  std::vector<int32_t> batch_sizes, context_lens;
  int32_t steps = 32, warmup_steps = 3;  // sweep
  double kv_fill_gib = 0.5;              // sweep: distinct K/V per layer at most

  // attention
  int32_t heads = 0, kv_heads = 0, head_dim = 0;  // 0: from --model, else 32 / 8 / 128
  int32_t iters = 100, repeats = 5;  // repeats: also the runner's measured runs (its default 1)
};

int run_bench_runner(const BenchOptions& o);
int run_bench_engine(const BenchOptions& o);
int run_bench_sweep(const BenchOptions& o);
int run_bench_attention(const BenchOptions& o);
int run_bench_serve(const BenchOptions& o);

}  // namespace serval::cli
