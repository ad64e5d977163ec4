// serval bench: offline throughput of the model runner. N requests of random
// tokens with given input/output lengths: all prompts are prefilled (in steps
// of at most --max-batch-tokens), then every sequence decodes one token per
// step, greedily, until each has output-len tokens. Reports tokens/s, the time
// per step, and each figure against its physical limit: decode steps against
// (weight + KV bytes read) / memory bandwidth, prefill against FLOPs / bf16 peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "core/error.h"
#include "model/model_loader.h"
#include "runtime/model_runner.h"

namespace serval::cli {
namespace {

struct BenchOptions {
  std::string model;
  int32_t requests = 1, input_len = 128, output_len = 128, max_batch_tokens = 8192;
  double bandwidth_gbs = 4261;  // H200 copy bandwidth measured for issue 5
  double peak_tflops = 736;     // H200 bf16 matmul measured for issue 5
  bool json = false;
  RunnerOptions runner;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Parameters of the matrices a forward pass streams (the LM head included,
// the embedding table not: only T of its rows are read).
double matrix_params(const ModelConfig& c) {
  const double H = double(c.hidden_size), Q = double(c.q_dim()), KV = double(c.kv_dim());
  const double layer = H * (Q + 2 * KV) + Q * H + 3 * H * double(c.intermediate_size);
  return layer * double(c.num_layers) + double(c.vocab_size) * H;
}

int run_bench(const BenchOptions& o) {
  SERVAL_CHECK(o.requests > 0 && o.input_len > 0 && o.output_len > 0 && o.max_batch_tokens > 0,
               "bench: requests, input-len, output-len and max-batch-tokens must be positive");
  const auto t_load = Clock::now();
  LoadedModel model = load_model(o.model);
  const ModelConfig& cfg = model.config;
  SERVAL_CHECK(o.input_len + o.output_len <= cfg.max_position, "bench: input-len + output-len = ",
               o.input_len + o.output_len, " exceeds the model's context of ", cfg.max_position);
  RunnerOptions ro = o.runner;
  const int32_t bs = ro.block_size;
  const int32_t blocks_per_seq = (o.input_len + o.output_len + bs - 1) / bs;
  ro.kv_cache_tokens = int64_t(o.requests) * blocks_per_seq * bs;
  std::unique_ptr<ModelRunner> runner = ModelRunner::create(cfg, model.weights, ro);
  const double load_s = seconds_since(t_load);

  const int32_t N = o.requests;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(cfg.vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts(size_t(N), std::vector<int32_t>(size_t(o.input_len)));
  for (auto& p : prompts)
    for (int32_t& t : p) t = tok(rng);
  std::vector<int32_t> last(static_cast<size_t>(N));  // last sampled token of each sequence
  auto slot = [&](int32_t seq, int32_t pos) { return int64_t(seq * blocks_per_seq + pos / bs) * bs + pos % bs; };
  auto add_seq = [&](Batch& b, int32_t seq, int32_t start, const std::vector<int32_t>& toks) {
    for (size_t i = 0; i < toks.size(); ++i) {
      b.token_ids.push_back(toks[i]);
      b.positions.push_back(start + int32_t(i));
      b.slot_mapping.push_back(slot(seq, start + int32_t(i)));
    }
    b.query_start.push_back(b.query_start.back() + int32_t(toks.size()));
    b.context_len.push_back(start + int32_t(toks.size()));
    for (int32_t k = 0; k < blocks_per_seq; ++k) b.block_table.push_back(seq * blocks_per_seq + k);
  };
  auto argmax_rows = [&](const std::vector<float>& logits, const std::vector<int32_t>& seqs) {
#pragma omp parallel for schedule(static) if (seqs.size() > 8)
    for (size_t r = 0; r < seqs.size(); ++r) {
      const float* row = logits.data() + r * size_t(cfg.vocab_size);
      last[size_t(seqs[r])] = int32_t(std::max_element(row, row + cfg.vocab_size) - row);
    }
  };
  std::vector<float> logits;

  // The whole run twice; the first is a warm-up (cuBLASLt plans for each shape,
  // lazy kernel loading, workspace growth) and its figures are dropped.
  const double mparams = matrix_params(cfg);
  const double weight_bytes = 2.0 * mparams;  // bf16
  const double kv_token_bytes = 2.0 * 2.0 * double(cfg.num_layers) * double(cfg.kv_dim());
  double prefill_s = 0, decode_s = 0, prefill_flops = 0, decode_bytes = 0;
  int64_t prefill_steps = 0;
  for (int pass = 0; pass < 2; ++pass) {
    prefill_flops = decode_bytes = 0;
    prefill_steps = 0;
    // Prefill.
    const auto t_prefill = Clock::now();
    for (int32_t s = 0, done = 0; s < N;) {
      Batch b;
      b.query_start = {0};
      b.max_blocks_per_seq = blocks_per_seq;
      std::vector<int32_t> finished;
      int32_t budget = o.max_batch_tokens;
      while (s < N && budget > 0) {
        const int32_t n = std::min(budget, o.input_len - done);
        add_seq(b, s, done, std::vector<int32_t>(prompts[size_t(s)].begin() + done, prompts[size_t(s)].begin() + done + n));
        // Attention: each new token at position p reads p + 1 keys.
        prefill_flops += 4.0 * double(cfg.num_layers) * double(cfg.q_dim()) * (double(done) * n + n * (n + 1) / 2.0);
        budget -= n;
        done += n;
        if (done == o.input_len) {
          b.logits_rows.push_back(b.num_tokens() - 1);
          finished.push_back(s);
          ++s;
          done = 0;
        }
      }
      prefill_flops += 2.0 * (mparams - double(cfg.vocab_size) * double(cfg.hidden_size)) * b.num_tokens() +
                       2.0 * double(cfg.vocab_size) * double(cfg.hidden_size) * double(b.logits_rows.size());
      runner->forward(b, logits);
      argmax_rows(logits, finished);
      ++prefill_steps;
    }
    prefill_s = seconds_since(t_prefill);

    // Decode: output-len - 1 steps (prefill produced the first token).
    const auto t_decode = Clock::now();
    std::vector<int32_t> all(static_cast<size_t>(N));
    for (int32_t i = 0; i < N; ++i) all[size_t(i)] = i;
    for (int32_t step = 1; step < o.output_len; ++step) {
      Batch b;
      b.query_start = {0};
      b.max_blocks_per_seq = blocks_per_seq;
      const int32_t pos = o.input_len + step - 1;
      for (int32_t s = 0; s < N; ++s) {
        add_seq(b, s, pos, {last[size_t(s)]});
        b.logits_rows.push_back(s);
      }
      runner->forward(b, logits);
      argmax_rows(logits, all);
      decode_bytes += weight_bytes + kv_token_bytes * double(N) * double(pos + 1);
    }
    decode_s = seconds_since(t_decode);
  }
  const int32_t decode_steps = o.output_len - 1;

  const double bw = o.bandwidth_gbs * 1e9, peak = o.peak_tflops * 1e12;
  const double prefill_tps = double(N) * o.input_len / prefill_s;
  const double decode_tps = decode_steps > 0 ? double(N) * decode_steps / decode_s : 0;
  const double step_ms = decode_steps > 0 ? decode_s / decode_steps * 1e3 : 0;
  const double decode_roofline = decode_steps > 0 ? (decode_bytes / bw) / decode_s : 0;
  const double mfu = prefill_flops / prefill_s / peak;
  const double total_tps = double(N) * (o.input_len + o.output_len - 1) / (prefill_s + decode_s);
  nlohmann::json j = {{"model", o.model},
                      {"device", ro.device},
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
                      {"total_tokens_per_s", total_tps},
                      {"bandwidth_gbs", o.bandwidth_gbs},
                      {"peak_tflops", o.peak_tflops}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("load %.2f s | %d requests x (%d in, %d out) on %s\n", load_s, N, o.input_len, o.output_len,
                ro.device.c_str());
    std::printf("prefill: %.0f tok/s in %lld steps (%.1f ms), %.1f%% of bf16 peak %.0f TFLOP/s\n", prefill_tps,
                (long long)prefill_steps, prefill_s * 1e3, 100 * mfu, o.peak_tflops);
    std::printf("decode: %.1f tok/s, %.3f ms/step over %d steps, %.1f%% of the %.0f GB/s roofline\n", decode_tps,
                step_ms, decode_steps, 100 * decode_roofline, o.bandwidth_gbs);
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto o = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand("bench", "Offline throughput: N requests x input/output lengths, vs the roofline");
  sub->add_option("--model,-m", o->model, "GGUF file or Hugging Face folder")->required();
  sub->add_option("--requests,-n", o->requests, "number of requests (sequences), all decoded together");
  sub->add_option("--input-len", o->input_len, "prompt tokens per request (random ids)");
  sub->add_option("--output-len", o->output_len, "generated tokens per request (greedy)");
  sub->add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per prefill step at most");
  sub->add_option("--bandwidth-gbs", o->bandwidth_gbs, "memory bandwidth for the decode roofline (GB/s)");
  sub->add_option("--peak-tflops", o->peak_tflops, "bf16 peak for prefill MFU (TFLOP/s)");
  sub->add_option("--device", o->runner.device, "cpu or cuda");
  sub->add_option("--threads", o->runner.threads, "CPU threads (default: all cores)");
  sub->add_flag("--json", o->json, "print one JSON object");
  sub->callback([&action, o] { action = [o] { return run_bench(*o); }; });
}

}  // namespace serval::cli
