// serval bench --mode engine: offline throughput through the whole Engine
// (continuous batching, chunked prefill, prefix cache, scheduler). N requests
// of random tokens (ignore_eos, so each produces exactly --output-len tokens)
// or the lines of a JSONL file, all submitted at once. A warm-up
// (engine/engine_warmup.h) first runs decode steps of every graph size up to
// --max-num-seqs at each class of context the run reaches, so lazy set-up
// (CUDA graph capture, matmul plans) stays out of the figures. The steps are
// timed by a StepRecorder around the runner.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "cli/batch_input.h"
#include "cli/batch_report.h"
#include "cli/bench_options.h"
#include "cli/bench_output.h"
#include "cli/bench_step_recorder.h"
#include "cli/generate_options.h"
#include "core/error.h"
#include "engine/engine_warmup.h"
#include "spec/oracle_proposer.h"

namespace serval::cli {
namespace {

using Clock = EngineClock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// What the client saw of one request (its only sample).
struct Outcome {
  int64_t tokens = 0;
  bool done = false, failed = false;
  std::string error;
  std::optional<Clock::time_point> arrival, first_token, finish, last_event;
};

// Submits every request at once, then polls their channels until all have finished.
// Inter-token latencies are the gaps between the client's receipt of
// consecutive token events (as a streaming client would see them; the poll loop
// sleeps 50 us when nothing came, so a gap is late by at most about that).
// --speculative oracle: each request's greedy continuation, recorded by a
// run without speculation first (on the runner itself: no steps recorded).
std::shared_ptr<Proposer> oracle_proposer(ModelRunner& runner, const Tokenizer& tok, EngineOptions eo,
                                          const std::vector<EngineRequest>& requests) {
  for (const EngineRequest& r : requests)
    SERVAL_CHECK(r.params.greedy(), "--speculative oracle drafts greedy continuations: run it with --temperature 0");
  const double acceptance = eo.speculative.oracle_acceptance;
  eo.speculative = SpeculativeConfig{};
  eo.proposer.reset();
  Engine pre(runner, tok, eo);
  std::vector<RequestHandle> handles = pre.submit_all(requests);
  std::vector<std::vector<int32_t>> sequences;
  for (size_t i = 0; i < handles.size(); ++i) {
    std::vector<int32_t> seq = requests[i].prompt_ids;
    for (;;) {
      std::optional<RequestEvent> ev = handles[i].next(std::chrono::milliseconds(600000));
      SERVAL_CHECK(ev.has_value(), "--speculative oracle: request ", i + 1, " gave no event in 10 minutes");
      seq.insert(seq.end(), ev->token_ids.begin(), ev->token_ids.end());
      if (!ev->finished()) continue;
      SERVAL_CHECK(ev->finish != FinishReason::kError, "--speculative oracle: request ", i + 1, " failed: ", ev->error);
      break;
    }
    sequences.push_back(std::move(seq));
  }
  pre.shutdown();
  return std::make_shared<OracleProposer>(std::move(sequences), acceptance, runner.config().vocab_size);
}

std::vector<Outcome> run_all(Engine& engine, const std::vector<EngineRequest>& requests,
                             std::vector<double>* itl_s) {
  // Together, so that the loop's first scheduling round sees them all.
  std::vector<RequestHandle> handles = engine.submit_all(requests);
  std::vector<Outcome> out(requests.size());
  std::vector<size_t> open(requests.size());
  for (size_t i = 0; i < open.size(); ++i) open[i] = i;
  while (!open.empty()) {
    bool progressed = false;
    size_t kept = 0;
    for (size_t i : open) {
      Outcome& o = out[i];
      while (!o.done) {
        std::optional<RequestEvent> ev = handles[i].next(std::chrono::milliseconds(0));
        if (!ev) break;
        progressed = true;
        const Clock::time_point now = Clock::now();
        o.arrival = ev->timings.arrival;
        if (ev->timings.first_token) o.first_token = ev->timings.first_token;
        if (!ev->token_ids.empty()) {
          if (itl_s && o.last_event) {
            const double gap = seconds(now - *o.last_event) / double(ev->token_ids.size());
            for (size_t k = 0; k < ev->token_ids.size(); ++k) itl_s->push_back(gap);
          }
          o.last_event = now;
          o.tokens += int64_t(ev->token_ids.size());
        }
        if (ev->finished()) {
          o.done = true;
          o.finish = ev->timings.finish;
          o.failed = ev->finish == FinishReason::kError;
          o.error = ev->error;
        }
      }
      if (!o.done) open[kept++] = i;
    }
    open.resize(kept);
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return out;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t vocab, int32_t len) {
  std::uniform_int_distribution<int32_t> tok(3, int32_t(vocab) - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = tok(rng);
  return p;
}

}  // namespace

int run_bench_engine(const BenchOptions& o) {
  const auto t_load = Clock::now();
  LoadedEngineModel m = load_engine_model(o.model, o.engine);
  const ModelConfig& cfg = m.model.config;
  const int64_t context = o.engine.scheduler.max_model_len > 0 ? o.engine.scheduler.max_model_len : cfg.max_position;
  const double load_s = seconds(Clock::now() - t_load);

  EngineRequest defaults;
  defaults.params.temperature = o.temperature;
  defaults.stop.max_tokens = o.output_len;
  defaults.stop.ignore_eos = true;
  defaults.stop.eos_token_ids = GenerateOptions::eos_ids(*m.tokenizer);
  std::vector<EngineRequest> requests;
  std::mt19937 rng(1234);
  if (!o.input.empty()) {
    std::ifstream in(o.input);
    SERVAL_CHECK(in.good(), "cannot open --input ", o.input);
    for (BatchItem& item : read_batch_input(in, *m.tokenizer, defaults, true)) {
      SERVAL_CHECK(item.request.n == 1, "--input line ", item.line + 1, ": bench takes one sample per request (n = 1)");
      requests.push_back(std::move(item.request));
    }
    SERVAL_CHECK(!requests.empty(), "--input ", o.input, " holds no requests");
  } else {
    for (int32_t i = 0; i < o.requests; ++i) {
      EngineRequest r = defaults;
      r.prompt_ids = random_prompt(rng, cfg.vocab_size, o.input_len);
      r.params.seed = uint64_t(i);
      requests.push_back(std::move(r));
    }
  }

  // Warm-up (engine/engine_warmup.h) up to the longest context a measured
  // request reaches; each request must fit the context and the pool on its
  // own (the engine preempts when they do not fit together).
  const int64_t max_seqs = o.engine.scheduler.max_num_seqs;
  const int32_t W = o.warmup_requests >= 0 ? o.warmup_requests
                                           : int32_t(std::min<int64_t>(int64_t(requests.size()), max_seqs));
  WarmupShape shape;
  shape.requests = W;
  for (const EngineRequest& r : requests)
    shape.longest = std::max<int64_t>(shape.longest, int64_t(r.prompt_ids.size()) + r.stop.max_tokens);
  shape.room = std::min<int64_t>(context, (m.runner->num_blocks() - 1) * m.runner->block_size());
  shape.budget = o.engine.scheduler.max_num_batched_tokens;
  shape.max_seqs = max_seqs;
  shape.block_size = m.runner->block_size();
  const WarmupPlan warmup = plan_warmup(
      defaults, shape, [&](int64_t len) { return random_prompt(rng, cfg.vocab_size, int32_t(len)); });

  EngineOptions eo = engine_options(o.engine);
  eo.scheduler.max_queued_requests =
      std::max<int64_t>({eo.scheduler.max_queued_requests, int64_t(requests.size()), int64_t(W)});
  const StepCost cost(cfg, m.runner->device(), m.runner->matrix_bytes(), m.plan.bytes_per_token);
  StepRecorder recorder(*m.runner, cost, o.limits);
  if (eo.speculative.method == "oracle") eo.proposer = oracle_proposer(*m.runner, *m.tokenizer, eo, requests);
  Engine engine(recorder, *m.tokenizer, eo);
  {
    std::string errors;
    size_t bad = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      try {
        engine.check(requests[i]);
      } catch (const Error& e) {
        if (++bad <= 10) errors += str_cat("\n  request ", i + 1, ": ", e.what());
      }
    }
    if (bad > 0) fail(bad, " of ", requests.size(), " requests cannot run (nothing was run):", errors);
  }

  const auto t_warmup = Clock::now();
  try {
    run_warmup(engine, warmup);
  } catch (const Error& e) {
    fail("bench: ", e.what(), "; use --warmup-requests 0");
  }
  const double warmup_s = seconds(Clock::now() - t_warmup);
  int32_t warmup_max_step_tokens = 0;  // the budget phase's step: should be the whole budget
  for (const StepRecord& r : recorder.steps())
    warmup_max_step_tokens = std::max(warmup_max_step_tokens, r.num_tokens);
  const std::string before = engine.metrics_registry().expose();
  const int64_t graphs_before = m.runner->graphs_captured();
  recorder.clear();

  std::vector<double> itl_s;
  const auto start = Clock::now();
  const std::vector<Outcome> outcomes = run_all(engine, requests, &itl_s);
  const double wall_s = seconds(Clock::now() - start);
  const std::string after = engine.metrics_registry().expose();
  auto delta = [&](const char* name) { return exposition_value(after, name) - exposition_value(before, name); };

  int64_t prompt_tokens = 0, output_tokens = 0, failed = 0;
  std::vector<double> ttft_s, tpot_s;
  std::string first_error;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& r = outcomes[i];
    prompt_tokens += int64_t(requests[i].prompt_ids.size());
    output_tokens += r.tokens;
    if (r.failed) {
      if (failed++ == 0) first_error = r.error;
      continue;
    }
    if (r.first_token && r.arrival) ttft_s.push_back(seconds(*r.first_token - *r.arrival));
    if (r.tokens >= 2 && r.first_token && r.finish)
      tpot_s.push_back(seconds(*r.finish - *r.first_token) / double(r.tokens - 1));
  }

  StepTotals all, decode;
  for (const StepRecord& s : recorder.steps()) {
    all.add(s, o.limits);
    if (s.decode) decode.add(s, o.limits);
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  BenchJson j = {{"mode", "engine"},
                 {"model", o.model},
                 {"device", m.runner->device()},
                 {"requests", int64_t(requests.size())},
                 {"input", o.input.empty() ? BenchJson(nullptr) : BenchJson(o.input)},
                 {"input_len", o.input.empty() ? BenchJson(o.input_len) : BenchJson(nullptr)},
                 {"output_len", o.input.empty() ? BenchJson(o.output_len) : BenchJson(nullptr)},
                 {"failed", failed},
                 {"prompt_tokens", prompt_tokens},
                 {"output_tokens", output_tokens},
                 {"load_s", load_s},
                 {"warmup_requests", W},
                 {"warmup_prompt_lens", warmup.prompt_lens},
                 {"warmup_s", warmup_s},
                 {"warmup_max_step_tokens", warmup_max_step_tokens},
                 {"duration_s", wall_s},
                 {"requests_per_s", double(requests.size()) / wall_s},
                 {"output_tokens_per_s", double(output_tokens) / wall_s},
                 {"total_tokens_per_s", double(prompt_tokens + output_tokens) / wall_s}};
  add_percentiles_ms("ttft", ttft_s, j);
  add_percentiles_ms("tpot", tpot_s, j);
  add_percentiles_ms("itl", itl_s, j);
  j["async_scheduling"] = engine.async_scheduling();
  j["late_continuations"] = engine.async_scheduling() && eo.late_continuations;
  j["steps"] = all.steps;
  j["mean_running_batch"] = ratio(all.seqs, double(all.steps));
  j["mean_step_ms"] = ratio(all.seconds, double(all.steps)) * 1e3;
  // The share of the wall time spent inside forward steps (start_sample to
  // finish_sample, during which the engine publishes the step before); the
  // rest is the engine loop's scheduling, batch building and commit, and idle gaps.
  j["step_time_fraction"] = ratio(all.seconds, wall_s);
  // Every step against max(bytes / bandwidth, FLOPs / peak).
  j["step_roofline_fraction"] = ratio(all.limit_s, all.seconds);
  // Every step against its ops one after another (StepCost::op_limit_s).
  j["step_op_limit_fraction"] = ratio(all.op_limit_s, all.seconds);
  // Where the engine loop's host time goes per step (means over all steps):
  // queueing the step; its own work while the device runs (publishing the
  // step before); waiting for the tokens; and between steps, while the
  // device idles (commit, scheduling, batch building).
  j["host_start_ms"] = ratio(all.start_s, double(all.steps)) * 1e3;
  j["host_under_device_ms"] = ratio(all.seconds - all.start_s - all.wait_s, double(all.steps)) * 1e3;
  j["host_wait_ms"] = ratio(all.wait_s, double(all.steps)) * 1e3;
  j["host_between_steps_ms"] = ratio(all.gap_s, double(all.gaps)) * 1e3;
  // Steps queued while the one before ran (async scheduling's continuations).
  j["pipelined_steps"] = all.pipelined;
  // Of those, steps queued only after the one before had ended (the device
  // idled for part of the host's work: a late continuation started too late).
  j["pipelined_after_end_steps"] = all.after_end;
  j["decode_steps"] = decode.steps;
  j["mean_decode_batch"] = ratio(decode.seqs, double(decode.steps));
  j["decode_step_ms"] = ratio(decode.seconds, double(decode.steps)) * 1e3;
  j["decode_roofline_fraction"] = ratio(decode.bytes_s, decode.seconds);
  j["decode_op_limit_fraction"] = ratio(decode.op_limit_s, decode.seconds);
  j["preemptions"] = int64_t(delta("serval:num_preemptions_total"));
  j["prefix_cache_hit_tokens"] = int64_t(delta("serval:prefix_cache_hits_total"));
  j["speculative"] = eo.speculative.method;
  j["num_speculative_tokens"] = eo.speculative.enabled() ? eo.speculative.num_tokens : 0;
  if (eo.speculative.method == "oracle") j["oracle_acceptance"] = eo.speculative.oracle_acceptance;
  add_speculative_stats(before, after, "", j);
  j["kv_cache_tokens"] = m.runner->num_blocks() * m.runner->block_size();
  j["max_num_seqs"] = max_seqs;
  j["max_num_batched_tokens"] = o.engine.scheduler.max_num_batched_tokens;
  j["graphs_captured"] = m.runner->graphs_captured();
  // Recorded during the measured run, its time included: what the warm-up
  // missed, or recorded again after a scratch buffer grew.
  j["graphs_captured_in_run"] = m.runner->graphs_captured() - graphs_before;
  j["bandwidth_gbs"] = o.limits.bandwidth_gbs;
  j["peak_tflops"] = o.limits.peak_tflops;
  if (o.json) std::printf("%s\n", j.dump().c_str());
  else print_key_values(j);
  engine.shutdown();
  SERVAL_CHECK(failed == 0, failed, " of ", requests.size(), " requests failed; the first: ", first_error);
  return 0;
}

}  // namespace serval::cli
