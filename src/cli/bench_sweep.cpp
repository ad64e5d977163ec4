// serval bench --mode sweep: batched decode steps at each point of
// --batch-sizes x --context-lens, through the model runner as the engine runs
// them (decode graphs included). The KV pool holds real data: one sequence is
// prefilled once and its blocks are copied over the pool. At a point, each of
// the B sequences gets a block table of ceil(C / block_size) blocks; when B x C
// tokens are more than the pool (or the --kv-fill-gib per layer that is
// filled), sequences share physical blocks ("aliased x N"), and the L2 cache
// may then serve some of the K/V reads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/bench_options.h"
#include "cli/bench_output.h"
#include "core/error.h"

namespace serval::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Prefills one sequence of `len` tokens into blocks 0.. of the pool.
void prefill_seed(ModelRunner& runner, int32_t len, int64_t chunk, std::mt19937& rng) {
  const int32_t bs = runner.block_size();
  const int32_t nb = (len + bs - 1) / bs;
  std::uniform_int_distribution<int32_t> tok(3, int32_t(runner.config().vocab_size) - 1);
  std::vector<float> logits;
  for (int32_t done = 0; done < len;) {
    const int32_t n = int32_t(std::min<int64_t>(chunk, len - done));
    Batch b;
    b.query_start = {0, n};
    b.context_len = {done + n};
    b.max_blocks_per_seq = nb;
    for (int32_t k = 0; k < nb; ++k) b.block_table.push_back(k);
    for (int32_t p = done; p < done + n; ++p) {
      b.token_ids.push_back(tok(rng));
      b.positions.push_back(p);
      b.slot_mapping.push_back(p);  // block k holds positions k * bs ..
    }
    runner.forward(b, logits);
    done += n;
  }
}

// A decode step of `batch` sequences at context `context`, sequence s owning
// blocks (s * nb + k) mod `pool_blocks`.
Batch decode_batch(int32_t batch, int32_t context, int32_t bs, int64_t pool_blocks) {
  const int32_t nb = (context + bs - 1) / bs;
  const int32_t pos = context - 1;
  Batch b;
  b.query_start = {0};
  b.max_blocks_per_seq = nb;
  for (int32_t s = 0; s < batch; ++s) {
    for (int32_t k = 0; k < nb; ++k) b.block_table.push_back(int32_t((int64_t(s) * nb + k) % pool_blocks));
    b.token_ids.push_back(3);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(int64_t(b.block_table[size_t(s) * nb + pos / bs]) * bs + pos % bs);
    b.query_start.push_back(s + 1);
    b.context_len.push_back(context);
    b.logits_rows.push_back(s);
  }
  return b;
}

}  // namespace

int run_bench_sweep(const BenchOptions& o) {
  const int32_t max_batch = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
  const int32_t max_context = *std::max_element(o.context_lens.begin(), o.context_lens.end());
  EngineFlags flags = o.engine;
  flags.scheduler.max_num_seqs = max_batch;
  flags.scheduler.max_num_batched_tokens = std::max<int64_t>(flags.scheduler.max_num_batched_tokens, max_batch);
  const auto t_load = Clock::now();
  LoadedEngineModel m = load_engine_model(o.model, flags);
  ModelRunner& runner = *m.runner;
  const ModelConfig& cfg = m.model.config;
  const double load_s = seconds_since(t_load);

  const StepCost cost(cfg, runner.device(), runner.matrix_bytes(), m.plan.bytes_per_token);
  // Real K/V everywhere a point reads: the seed sequence, then copies of its blocks.
  const int32_t bs = runner.block_size();
  const int64_t pool_blocks = runner.num_blocks();
  int64_t need_blocks = 0;
  for (int32_t B : o.batch_sizes)
    for (int32_t C : o.context_lens) need_blocks = std::max(need_blocks, int64_t(B) * ((C + bs - 1) / bs));
  // Distinct blocks are capped at --kv-fill-gib of K/V per layer: filling the
  // pool is one copy per block and layer, and a layer's reads come back to
  // an aliased block only after that many bytes, far more than an L2 holds.
  const double block_layer_bytes = cost.kv_bytes_per_token() / double(cfg.num_layers) * bs;
  const int64_t fill_blocks = std::max<int64_t>(1, int64_t(o.kv_fill_gib * double(int64_t(1) << 30) / block_layer_bytes));
  const int64_t used_blocks = std::min({need_blocks, pool_blocks, fill_blocks});
  int32_t seed_len = int32_t(std::min<int64_t>({max_context, used_blocks * bs, 2048}));
  if (seed_len >= bs) seed_len = seed_len / bs * bs;
  const int64_t seed_blocks = (seed_len + bs - 1) / bs;
  std::mt19937 rng(1234);
  const auto t_fill = Clock::now();
  prefill_seed(runner, seed_len, flags.scheduler.max_num_batched_tokens, rng);
  std::vector<std::pair<int32_t, int32_t>> copies;
  for (int64_t i = seed_blocks; i < used_blocks; ++i) {
    copies.emplace_back(int32_t(i % seed_blocks), int32_t(i));
    if (copies.size() == 4096 || i + 1 == used_blocks) {
      runner.copy_blocks(copies);
      copies.clear();
    }
  }
  std::fprintf(stderr, "sweep: KV pool of %lld blocks; %lld filled from a %d-token prefill in %.2f s\n",
               (long long)pool_blocks, (long long)used_blocks, seed_len, seconds_since(t_fill));
  if (need_blocks > used_blocks)
    std::fprintf(stderr, "sweep: points with aliased > 1 read more K/V than the %lld filled blocks (the pool, or "
                         "--kv-fill-gib per layer): their sequences share physical blocks, and the L2 cache may "
                         "serve some of those reads\n", (long long)used_blocks);

  PointPrinter printer(o.json, {{"batch", "batch", 1, 0},
                                {"context_len", "context", 1, 0},
                                {"step_ms", "step ms", 1, 3},
                                {"tokens_per_s", "tok/s", 1, 1},
                                {"bytes_per_step", "GB/step", 1e-9, 3},
                                {"roofline_ms", "limit ms", 1, 3},
                                {"roofline_fraction", "roofline %", 100, 1},
                                {"flop_fraction", "FLOP %", 100, 1},
                                {"op_limit_fraction", "op limit %", 100, 1},
                                {"aliased", "aliased x", 1, 1}});
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<SampleSpec> specs;
  std::vector<SampleResult> results;
  for (int32_t B : o.batch_sizes) {
    specs.assign(size_t(B), SampleSpec{});
    for (int32_t s = 0; s < B; ++s) {
      specs[size_t(s)].row = s;
      specs[size_t(s)].params = &greedy;
    }
    for (int32_t C : o.context_lens) {
      Batch b = decode_batch(B, C, bs, used_blocks);
      auto step = [&] {
        runner.forward_sample(b, specs, results);
        for (int32_t s = 0; s < B; ++s) b.token_ids[size_t(s)] = results[size_t(s)].token;
      };
      for (int32_t i = 0; i < o.warmup_steps; ++i) step();
      const int64_t replays = runner.graph_replays();
      const auto t0 = Clock::now();
      for (int32_t i = 0; i < o.steps; ++i) step();
      const double step_s = seconds_since(t0) / o.steps;
      const int64_t nb = (C + bs - 1) / bs;
      const double bytes = cost.decode_bytes(B, C), flops = cost.decode_flops(B, C);
      const double limit_s = o.limits.seconds_for_bytes(bytes);
      const double op_limit_s = cost.decode_op_limit_s(o.limits, B, C);
      printer.print({{"mode", "sweep"},
                     {"device", runner.device()},
                     {"batch", B},
                     {"context_len", C},
                     {"steps", o.steps},
                     {"step_ms", step_s * 1e3},
                     {"tokens_per_s", double(B) / step_s},
                     {"weight_bytes", cost.weight_bytes()},
                     {"kv_bytes_per_step", double(B) * cost.kv_read_bytes(C)},
                     {"bytes_per_step", bytes},
                     {"roofline_ms", limit_s * 1e3},
                     {"roofline_fraction", limit_s / step_s},
                     {"flops_per_step", flops},
                     {"flop_fraction", o.limits.seconds_for_flops(flops) / step_s},
                     {"op_limit_ms", op_limit_s * 1e3},
                     {"op_limit_fraction", op_limit_s / step_s},
                     {"kv_blocks", std::min<int64_t>(int64_t(B) * nb, used_blocks)},
                     {"aliased", std::max(1.0, double(int64_t(B) * nb) / double(used_blocks))},
                     {"graph", runner.graph_replays() - replays == o.steps},
                     {"load_s", load_s},
                     {"bandwidth_gbs", o.limits.bandwidth_gbs},
                     {"peak_tflops", o.limits.peak_tflops}});
    }
  }
  return 0;
}

}  // namespace serval::cli
