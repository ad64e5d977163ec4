// serval bench --mode runner: N requests of random tokens straight through the
// model runner. All prompts are prefilled (in steps of at most
// --max-batch-tokens), then every sequence decodes one token per step, greedy,
// sampled on the runner's device (forward_sample), until each has output-len
// tokens. Each decode step is queued before the host has the tokens of the
// one before (they are fed to it on the device: Batch::token_source), unless
// --sync-steps. Decode steps are compared with (weight + KV bytes read) / memory
// bandwidth, prefill with FLOPs / bf16 peak. With --repeats N the run is
// measured N times and the median reported, with the range.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>

#include "cli/bench_options.h"
#include "cli/bench_output.h"
#include "core/error.h"

namespace serval::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int run_bench_runner(const BenchOptions& o) {
  const auto t_load = Clock::now();
  EngineFlags flags = o.engine;
  const int32_t bs = flags.block_size;
  SERVAL_CHECK(bs >= 1 && bs <= 1024, "--block-size must be in [1, 1024], got ", bs);
  const int32_t N = o.requests;
  const int32_t blocks_per_seq = (o.input_len + o.output_len + bs - 1) / bs;
  // The pool holds exactly the N sequences; the runner plans activations for
  // the largest prefill step and graphs for a decode step of N.
  flags.kv_cache_tokens = int64_t(N) * blocks_per_seq * bs;
  flags.scheduler.max_num_seqs = N;
  flags.scheduler.max_num_batched_tokens = o.max_batch_tokens;
  LoadedEngineModel m = load_engine_model(o.model, flags);
  ModelRunner& runner = *m.runner;
  const ModelConfig& cfg = m.model.config;
  const double load_s = seconds_since(t_load);

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(cfg.vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts(size_t(N), std::vector<int32_t>(size_t(o.input_len)));
  for (auto& p : prompts)
    for (int32_t& t : p) t = tok(rng);
  std::vector<int32_t> last(static_cast<size_t>(N));  // last sampled token of each sequence
  auto slot = [&](int32_t seq, int32_t pos) { return int64_t(seq * blocks_per_seq + pos / bs) * bs + pos % bs; };
  auto add_seq = [&](Batch& b, int32_t seq, int32_t start, const int32_t* toks, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
      b.token_ids.push_back(toks[i]);
      b.positions.push_back(start + i);
      b.slot_mapping.push_back(slot(seq, start + i));
    }
    b.query_start.push_back(b.query_start.back() + n);
    b.context_len.push_back(start + n);
    for (int32_t k = 0; k < blocks_per_seq; ++k) b.block_table.push_back(seq * blocks_per_seq + k);
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<SampleSpec> specs;
  std::vector<SampleResult> results;
  // One greedy spec per logits row; the sampled tokens go to `seqs`. start
  // queues a step, finish takes the tokens of the oldest one queued.
  std::deque<std::vector<int32_t>> queued;
  auto start = [&](const Batch& b, const std::vector<int32_t>& seqs) {
    specs.assign(seqs.size(), SampleSpec{});
    for (size_t r = 0; r < seqs.size(); ++r) {
      specs[r].row = int32_t(r);
      specs[r].params = &greedy;
    }
    runner.start_sample(b, specs);
    queued.push_back(seqs);
  };
  auto finish = [&] {
    runner.finish_sample(results);
    const std::vector<int32_t>& seqs = queued.front();
    for (size_t r = 0; r < seqs.size(); ++r) last[size_t(seqs[r])] = results[r].token;
    queued.pop_front();
  };
  auto step = [&](const Batch& b, const std::vector<int32_t>& seqs) {
    start(b, seqs);
    finish();
  };

  const StepCost cost(cfg, runner.device(), runner.matrix_bytes(), m.plan.bytes_per_token);
  // The whole run 1 + --repeats times; the first is a warm-up (cuBLASLt plans
  // for each shape, lazy kernel loading, workspace growth, decode graphs) and
  // its figures are dropped. Every pass does the same work.
  struct Pass {
    double prefill_s = 0, decode_s = 0;
  };
  std::vector<Pass> passes;
  double prefill_flops = 0, decode_bytes = 0, decode_op_limit_s = 0;
  int64_t prefill_steps = 0;
  for (int pass = 0; pass <= o.repeats; ++pass) {
    prefill_flops = decode_bytes = decode_op_limit_s = 0;
    prefill_steps = 0;
    const auto t_prefill = Clock::now();
    for (int32_t s = 0, done = 0; s < N;) {
      Batch b;
      b.query_start = {0};
      b.max_blocks_per_seq = blocks_per_seq;
      std::vector<int32_t> finished;
      int32_t budget = o.max_batch_tokens;
      while (s < N && budget > 0) {
        const int32_t n = std::min(budget, o.input_len - done);
        add_seq(b, s, done, prompts[size_t(s)].data() + done, n);
        prefill_flops += cost.attention_flops(n, done + n);
        budget -= n;
        done += n;
        if (done == o.input_len) {
          b.logits_rows.push_back(b.num_tokens() - 1);
          finished.push_back(s);
          ++s;
          done = 0;
        }
      }
      prefill_flops += cost.matmul_flops(b.num_tokens(), int64_t(b.logits_rows.size()));
      step(b, finished);
      ++prefill_steps;
    }
    const double prefill_s = seconds_since(t_prefill);

    // Decode: output-len - 1 steps (prefill produced the first token).
    const auto t_decode = Clock::now();
    std::vector<int32_t> all(static_cast<size_t>(N));
    for (int32_t i = 0; i < N; ++i) all[size_t(i)] = i;
    for (int32_t t = 1; t < o.output_len; ++t) {
      Batch b;
      b.query_start = {0};
      b.max_blocks_per_seq = blocks_per_seq;
      const int32_t pos = o.input_len + t - 1;
      // Chained: step t's tokens are step t - 1's samples, spec s for sequence s.
      const bool chained = !o.sync_steps && t > 1;
      for (int32_t s = 0; s < N; ++s) {
        add_seq(b, s, pos, &last[size_t(s)], 1);
        b.logits_rows.push_back(s);
        if (chained) b.token_source.push_back(s);
      }
      start(b, all);
      if (o.sync_steps || t > 1) finish();
      decode_bytes += cost.decode_bytes(N, pos + 1);
      decode_op_limit_s += cost.decode_op_limit_s(o.limits, N, pos + 1);
    }
    while (!queued.empty()) finish();
    if (pass > 0) passes.push_back({prefill_s, seconds_since(t_decode)});
  }
  const int32_t decode_steps = o.output_len - 1;
  // The median pass (by decode time; by prefill time when there is no decode)
  // is reported, and with --repeats the range of the passes.
  std::sort(passes.begin(), passes.end(), [&](const Pass& a, const Pass& b) {
    return decode_steps > 0 ? a.decode_s < b.decode_s : a.prefill_s < b.prefill_s;
  });
  const double prefill_s = passes[passes.size() / 2].prefill_s, decode_s = passes[passes.size() / 2].decode_s;
  auto tps_range = [&](double Pass::*field, double tokens) {
    double lo = 1e300, hi = 0;
    for (const Pass& p : passes) {
      lo = std::min(lo, tokens / (p.*field));
      hi = std::max(hi, tokens / (p.*field));
    }
    return std::pair<double, double>{lo, hi};
  };

  const double prefill_tps = double(N) * o.input_len / prefill_s;
  const double decode_tps = decode_steps > 0 ? double(N) * decode_steps / decode_s : 0;
  const double step_ms = decode_steps > 0 ? decode_s / decode_steps * 1e3 : 0;
  const double decode_roofline = decode_steps > 0 ? o.limits.seconds_for_bytes(decode_bytes) / decode_s : 0;
  const double decode_op_limit = decode_steps > 0 ? decode_op_limit_s / decode_s : 0;
  const double mfu = o.limits.seconds_for_flops(prefill_flops) / prefill_s;
  const double total_tps = double(N) * (o.input_len + o.output_len - 1) / (prefill_s + decode_s);
  BenchJson j = {{"mode", "runner"},
                 {"model", o.model},
                 {"device", runner.device()},
                 {"requests", N},
                 {"input_len", o.input_len},
                 {"output_len", o.output_len},
                 {"load_s", load_s},
                 {"prefill_s", prefill_s},
                 {"prefill_steps", prefill_steps},
                 {"prefill_tokens_per_s", prefill_tps},
                 {"prefill_mfu", mfu},
                 {"decode_s", decode_s},
                 {"decode_steps", decode_steps},
                 {"decode_step_ms", step_ms},
                 {"decode_tokens_per_s", decode_tps},
                 {"decode_roofline_fraction", decode_roofline},
                 {"weight_bytes_per_step", cost.weight_bytes()},
                 {"decode_op_limit_fraction", decode_op_limit},
                 {"total_tokens_per_s", total_tps},
                 {"graph_replays", runner.graph_replays()},
                 {"sync_steps", o.sync_steps},
                 {"bandwidth_gbs", o.limits.bandwidth_gbs},
                 {"peak_tflops", o.limits.peak_tflops}};
  const auto [prefill_lo, prefill_hi] = tps_range(&Pass::prefill_s, double(N) * o.input_len);
  const auto [decode_lo, decode_hi] = tps_range(&Pass::decode_s, double(N) * decode_steps);
  if (o.repeats > 1) {
    j["repeats"] = o.repeats;
    j["prefill_tokens_per_s_min"] = prefill_lo;
    j["prefill_tokens_per_s_max"] = prefill_hi;
    if (decode_steps > 0) {
      j["decode_tokens_per_s_min"] = decode_lo;
      j["decode_tokens_per_s_max"] = decode_hi;
    }
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("load %.2f s | %d requests x (%d in, %d out) on %s\n", load_s, N, o.input_len, o.output_len,
                runner.device().c_str());
    std::printf("prefill: %.0f tok/s in %lld steps (%.1f ms), %.1f%% of bf16 peak %.0f TFLOP/s\n", prefill_tps,
                (long long)prefill_steps, prefill_s * 1e3, 100 * mfu, o.limits.peak_tflops);
    std::printf("decode: %.1f tok/s, %.3f ms/step over %d steps, %.1f%% of the %.0f GB/s roofline (weights: %.2f GB "
                "a step), %.1f%% of the op-by-op limit\n",
                decode_tps, step_ms, decode_steps, 100 * decode_roofline, o.limits.bandwidth_gbs,
                cost.weight_bytes() / 1e9, 100 * decode_op_limit);
    if (o.repeats > 1)
      std::printf("the median of %d passes; their range: prefill %.0f-%.0f tok/s, decode %.1f-%.1f tok/s\n",
                  o.repeats, prefill_lo, prefill_hi, decode_lo, decode_hi);
  }
  return 0;
}

}  // namespace serval::cli
