#include "cli/engine_flags.h"

namespace serval::cli {

EngineOptions EngineFlags::engine_options(const std::string& model_name) const {
  EngineOptions o = engine;
  o.enable_prefix_cache = !no_prefix_cache;
  o.model_name = model_name;
  return o;
}

void add_engine_flags(CLI::App& sub, EngineFlags& f) {
  SchedulerConfig& s = f.engine.scheduler;
  sub.add_option("--max-num-seqs", s.max_num_seqs, "requests running at once")->capture_default_str();
  sub.add_option("--max-num-batched-tokens", s.max_num_batched_tokens, "tokens per engine step (prefill chunk budget)")
      ->capture_default_str();
  sub.add_option("--max-queued-requests", s.max_queued_requests,
                 "waiting requests; more are refused (HTTP 429)")->capture_default_str();
  sub.add_option("--max-model-len", s.max_model_len, "context length in tokens (default: the model's)");
  sub.add_option("--kv-cache-tokens", f.runner.kv_cache_tokens, "KV pool size in tokens (default: automatic)");
  sub.add_flag("--no-prefix-cache", f.no_prefix_cache, "disable prefix caching (on by default)");
  sub.add_option("--threads", f.runner.threads, "CPU threads (default: all cores)");
}

}  // namespace serval::cli
