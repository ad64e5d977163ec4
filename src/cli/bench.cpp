// serval bench: the benchmark tool of issue 5 (cli/bench_options.h lists the
// modes). This file holds the flags, checks that each flag given applies to
// the chosen mode, fills the mode's defaults and runs it.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "cli/bench_options.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/model_loader.h"

namespace serval::cli {
namespace {

const std::vector<std::string> kModes = {"runner", "engine", "sweep", "attention", "serve"};

// Flags that only some modes read; a flag given to another mode is an error
// rather than silently ignored. Flags not listed are read by every mode that
// runs a model of its own (model_modes: all but serve).
const std::set<std::string>& model_modes() {
  static const std::set<std::string> m = {"runner", "engine", "sweep", "attention"};
  return m;
}

const std::map<std::string, std::set<std::string>>& flag_modes() {
  static const std::map<std::string, std::set<std::string>> m = {
      {"--requests", {"runner", "engine", "serve"}},
      {"--input-len", {"runner", "engine", "serve"}},
      {"--output-len", {"runner", "engine", "serve"}},
      {"--max-batch-tokens", {"runner"}},
      {"--input", {"engine", "serve"}},
      {"--temperature", {"engine", "serve"}},
      {"--url", {"serve"}},
      {"--endpoint", {"serve"}},
      {"--request-rate", {"serve"}},
      {"--max-concurrency", {"serve"}},
      {"--seed", {"serve"}},
      {"--prefix-len", {"serve"}},
      {"--slo-ttft-ms", {"serve"}},
      {"--slo-tpot-ms", {"serve"}},
      {"--json", {"runner", "engine", "sweep", "attention", "serve"}},
      {"--warmup-requests", {"engine"}},
      {"--batch-sizes", {"sweep", "attention"}},
      {"--context-lens", {"sweep", "attention"}},
      {"--steps", {"sweep"}},
      {"--warmup-steps", {"sweep"}},
      {"--kv-fill-gib", {"sweep"}},
      {"--heads", {"attention"}},
      {"--kv-heads", {"attention"}},
      {"--head-dim", {"attention"}},
      {"--iters", {"attention"}},
      {"--repeats", {"attention", "runner"}},
      {"--sync-steps", {"runner"}},
      {"--peak-tflops", {"runner", "engine", "sweep"}},
      {"--gpu-memory-fraction", {"runner", "engine", "sweep"}},
      {"--kv-cache-tokens", {"engine", "sweep"}},
      {"--kv-cache-memory-fraction", {"engine", "sweep"}},
      {"--max-num-seqs", {"engine"}},
      {"--max-num-batched-tokens", {"engine", "sweep"}},
      {"--max-queued-requests", {"engine"}},
      {"--no-prefix-cache", {"engine"}},
      {"--no-async-scheduling", {"engine"}},
      {"--async-scheduling", {"engine"}},
      {"--no-late-continuations", {"engine"}},
      {"--gemm-search", {"runner", "engine", "sweep"}},  // attention runs no matmul
      {"--gemm-search-cache", {"runner", "engine", "sweep"}},
  };
  return m;
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

void check_sizes(const std::vector<int32_t>& v, const char* flag) {
  SERVAL_CHECK(!v.empty(), "bench: ", flag, " is empty");
  for (int32_t x : v) SERVAL_CHECK(x > 0, "bench: ", flag, " must hold positive numbers, got ", x);
}

int run_bench(BenchOptions o, const CLI::App& sub) {
  for (const auto& [flag, modes] : flag_modes())
    SERVAL_CHECK(sub.get_option_no_throw(flag) != nullptr, "bench: internal: no flag ", flag);
  for (const CLI::Option* opt : sub.get_options()) {
    const std::string flag = opt->get_name();
    if (opt->count() == 0 || flag == "--mode") continue;
    const auto it = flag_modes().find(flag);
    const std::set<std::string>& modes = it != flag_modes().end() ? it->second : model_modes();
    SERVAL_CHECK(modes.count(o.mode) > 0, "bench: ", flag, " does not apply to --mode ", o.mode, " (it is for --mode ",
                 join(modes), ")");
  }
  SERVAL_CHECK(o.mode == "attention" || o.mode == "serve" || !o.model.empty(), "bench: --mode ", o.mode,
               " needs --model");
  SERVAL_CHECK(o.limits.bandwidth_gbs > 0 && o.limits.peak_tflops > 0,
               "bench: --bandwidth-gbs and --peak-tflops must be positive");
  const bool lengths = o.mode == "runner" || ((o.mode == "engine" || o.mode == "serve") && o.input.empty());
  if (lengths) {
    SERVAL_CHECK(o.requests > 0 && o.input_len > 0 && o.output_len > 0,
                 "bench: --requests, --input-len and --output-len must be positive");
  }
  if (o.mode == "runner") {
    SERVAL_CHECK(o.max_batch_tokens > 0, "bench: --max-batch-tokens must be positive");
    if (sub.get_option("--repeats")->count() == 0) o.repeats = 1;
    SERVAL_CHECK(o.repeats > 0, "bench: --repeats must be positive");
  }
  if (o.mode == "engine" || o.mode == "serve") {
    SERVAL_CHECK(o.input.empty() || (sub.get_option("--requests")->count() == 0 &&
                                     sub.get_option("--input-len")->count() == 0),
                 "bench: --input takes the requests from the file: drop --requests / --input-len");
    SERVAL_CHECK(o.input.empty() || std::ifstream(o.input).good(), "cannot open --input ", o.input);
    SERVAL_CHECK(o.output_len > 0, "bench: --output-len must be positive");
    SERVAL_CHECK(o.warmup_requests >= -1, "bench: --warmup-requests must be -1 (auto), 0 (none) or a count");
    SERVAL_CHECK(o.temperature >= 0, "bench: --temperature must not be negative, got ", o.temperature);
  }
  if (o.mode == "serve") {
    SERVAL_CHECK(o.request_rate > 0, "bench: --request-rate must be positive (inf: all at once), got ",
                 o.request_rate);
    SERVAL_CHECK(o.max_concurrency >= 0, "bench: --max-concurrency must be positive (0: no limit)");
    SERVAL_CHECK(o.prefix_len >= 0, "bench: --prefix-len must not be negative");
    SERVAL_CHECK(o.prefix_len == 0 || o.input.empty(), "bench: --prefix-len is for random prompts, not --input");
    SERVAL_CHECK(o.endpoint == "completions" || !o.input.empty(),
                 "bench: --endpoint chat takes its requests from --input (chat requests with \"messages\"); "
                 "random prompts are token ids, for --endpoint completions");
    SERVAL_CHECK(o.slo_ttft_ms >= 0 && o.slo_tpot_ms >= 0, "bench: --slo-ttft-ms and --slo-tpot-ms must not be "
                 "negative");
  }
  if (o.mode == "sweep" || o.mode == "attention") {
    if (o.batch_sizes.empty())
      o.batch_sizes = o.mode == "sweep" ? std::vector<int32_t>{1, 8, 32, 64, 128, 256} : std::vector<int32_t>{1, 64};
    if (o.context_lens.empty())
      o.context_lens = o.mode == "sweep" ? std::vector<int32_t>{128, 1024, 4096} : std::vector<int32_t>{4096, 16384, 32768};
    check_sizes(o.batch_sizes, "--batch-sizes");
    check_sizes(o.context_lens, "--context-lens");
    SERVAL_CHECK(o.steps > 0 && o.warmup_steps >= 0, "bench: --steps must be positive and --warmup-steps not negative");
    SERVAL_CHECK(o.kv_fill_gib > 0, "bench: --kv-fill-gib must be positive, got ", o.kv_fill_gib);
    SERVAL_CHECK(o.iters > 0 && o.repeats > 0, "bench: --iters and --repeats must be positive");
    for (int32_t h : {o.heads, o.kv_heads, o.head_dim})
      SERVAL_CHECK(h >= 0, "bench: --heads, --kv-heads and --head-dim must be positive");
  }
  // Lengths against the context, before the (slow) runner is built. Reading
  // the configuration maps the file; the mode loads it again.
  if (!o.model.empty()) {
    const int64_t model_ctx = load_model(o.model).config.max_position;
    const int64_t max_len = o.engine.scheduler.max_model_len;
    SERVAL_CHECK(max_len >= 0 && max_len <= model_ctx, "--max-model-len must be in [1, ", model_ctx,
                 "] (the model's context), got ", max_len);
    const int64_t context = max_len > 0 ? max_len : model_ctx;
    const char* whose = max_len > 0 ? "--max-model-len" : "the model's context";
    if (lengths)
      SERVAL_CHECK(int64_t(o.input_len) + o.output_len <= context, "bench: --input-len + --output-len = ",
                   int64_t(o.input_len) + o.output_len, " exceeds ", whose, " of ", context, " tokens");
    for (int32_t c : o.context_lens)
      SERVAL_CHECK(c <= context, "bench: --context-lens ", c, " exceeds ", whose, " of ", context, " tokens");
  }
  if (o.mode == "engine") return run_bench_engine(o);
  if (o.mode == "serve") return run_bench_serve(o);
  if (o.mode == "sweep") return run_bench_sweep(o);
  if (o.mode == "attention") return run_bench_attention(o);
  return run_bench_runner(o);
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto o = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand(
      "bench",
      "Benchmarks against the physical limits: runner / engine throughput, a decode sweep, attention alone; and a "
      "running server under load");
  sub->add_option("--mode", o->mode,
                  "runner: N requests straight through the model runner (default); engine: offline throughput "
                  "through the Engine; sweep: decode steps at batch sizes x context lengths; attention: the "
                  "decode attention kernel alone; serve: a running OpenAI-compatible server (--url) under load")
      ->check(CLI::IsMember(kModes));
  sub->add_option("--model,-m", o->model, "GGUF file or Hugging Face folder (attention: optional, for the shape)");
  sub->add_option("--requests,-n", o->requests, "runner, engine, serve: number of requests (random token prompts)");
  sub->add_option("--input-len", o->input_len, "runner, engine, serve: prompt tokens per request");
  sub->add_option("--output-len", o->output_len,
                  "runner, engine, serve: generated tokens per request (--input: the lines' default max_tokens)");
  sub->add_option("--max-batch-tokens", o->max_batch_tokens, "runner: tokens per prefill step at most (default 8192)");
  sub->add_option("--input", o->input,
                  "engine, serve: a JSONL file of requests (the format of generate --input) instead of random ones");
  sub->add_option("--temperature", o->temperature, "engine, serve: sampling temperature (default 0: greedy)");
  sub->add_option("--url", o->url, "serve: the server (http://HOST:PORT, default http://127.0.0.1:8000)");
  sub->add_option("--endpoint", o->endpoint,
                  "serve: completions (/v1/completions, default) or chat (/v1/chat/completions, with --input)")
      ->check(CLI::IsMember({"completions", "chat"}));
  sub->add_option("--request-rate", o->request_rate,
                  "serve: requests a second, Poisson arrivals (default inf: all at once)");
  sub->add_option("--max-concurrency", o->max_concurrency, "serve: requests in flight at most (default 0: no limit)");
  sub->add_option("--seed", o->seed, "serve: seed of the random prompts and arrivals (default 0)");
  sub->add_option("--prefix-len", o->prefix_len,
                  "serve: tokens every random prompt starts with, the same for all (a shared system prompt: "
                  "the server's prefix cache), before its --input-len own");
  sub->add_option("--slo-ttft-ms", o->slo_ttft_ms,
                  "serve: goodput counts requests whose TTFT is at most this (default 0: no limit)");
  sub->add_option("--slo-tpot-ms", o->slo_tpot_ms,
                  "serve: goodput counts requests whose TPOT is at most this (default 0: no limit)");
  sub->add_option("--warmup-requests", o->warmup_requests,
                  "engine: W requests run first, unmeasured, so that decode steps of every graph size up to W run "
                  "at each class of context the run reaches (default -1: min(requests, max-num-seqs); 0: none)");
  sub->add_option("--batch-sizes", o->batch_sizes,
                  "sweep, attention: comma-separated (default sweep 1,8,32,64,128,256; attention 1,64)")
      ->delimiter(',');
  sub->add_option("--context-lens", o->context_lens,
                  "sweep, attention: comma-separated (default sweep 128,1024,4096; attention 4096,16384,32768)")
      ->delimiter(',');
  sub->add_option("--steps", o->steps, "sweep: timed decode steps per point (default 32)");
  sub->add_option("--warmup-steps", o->warmup_steps, "sweep: untimed steps before them (default 3)");
  sub->add_option("--kv-fill-gib", o->kv_fill_gib,
                  "sweep: fill at most this much distinct K/V per layer (GiB, default 0.5, 10x an H200's L2): one "
                  "copy per block and layer; larger points share blocks (aliased)");
  sub->add_option("--heads", o->heads, "attention: query heads (default: the model's, else 32)");
  sub->add_option("--kv-heads", o->kv_heads, "attention: KV heads (default: the model's, else 8)");
  sub->add_option("--head-dim", o->head_dim, "attention: head dimension (default: the model's, else 128)");
  sub->add_option("--iters", o->iters, "attention: calls per timing (default 100)");
  sub->add_option("--repeats", o->repeats,
                  "attention: timings (default 5); runner: measured runs after the warm-up (default 1); the "
                  "median is reported, and the runner's range");
  sub->add_option("--bandwidth-gbs", o->limits.bandwidth_gbs, "memory bandwidth for the rooflines (GB/s, default 4261)");
  sub->add_option("--peak-tflops", o->limits.peak_tflops, "bf16 peak for MFU / FLOP fractions (TFLOP/s, default 736)");
  sub->add_flag("--json", o->json, "one JSON object per measured point, one per line");
  sub->add_flag("--sync-steps", o->sync_steps,
                "runner: wait for each decode step's tokens before queueing the next (default: step N + 1 is "
                "queued first, its tokens fed from step N's on the device)");
  add_engine_flags(*sub, o->engine);
  sub->callback([&action, o, sub] { action = [o, sub] { return run_bench(*o, *sub); }; });
}

}  // namespace serval::cli
