#include "cli/engine_flags.h"

#include <cstdio>

#include "core/dtype.h"

namespace serval::cli {

void add_engine_flags(CLI::App& sub, EngineFlags& f) {
  sub.add_option("--max-num-seqs", f.scheduler.max_num_seqs, "sequences running at once");
  sub.add_option("--max-num-batched-tokens", f.scheduler.max_num_batched_tokens,
                 "tokens per step (the chunked-prefill budget)");
  sub.add_option("--max-queued-requests", f.scheduler.max_queued_requests,
                 "waiting requests before new ones are refused");
  sub.add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV pool size in tokens");
  sub.add_option("--kv-cache-memory-fraction", f.kv_cache_memory_fraction,
                 "KV pool: this fraction of the memory left after the weights (default: "
                 "4 sequences of the context, at most 4096 tokens each)");
  sub.add_option("--max-model-len", f.scheduler.max_model_len,
                 "context length in tokens, prompt + output (default: the model's)");
  sub.add_flag("--no-prefix-cache", f.no_prefix_cache, "turn the radix prefix cache off");
  sub.add_option("--block-size", f.block_size, "tokens per KV block");
  sub.add_option("--threads", f.threads, "CPU threads (default: all cores)");
  sub.add_option("--device", f.device, "cpu or cuda (default: cpu)");
}

EngineOptions engine_options(const EngineFlags& f) {
  EngineOptions o;
  o.scheduler = f.scheduler;
  o.scheduler.validate();
  o.enable_prefix_cache = !f.no_prefix_cache;
  return o;
}

LoadedEngineModel load_engine_model(const std::string& path, const EngineFlags& f) {
  SERVAL_CHECK(f.block_size >= 1 && f.block_size <= 1024, "--block-size must be in [1, 1024], got ",
               f.block_size);
  SERVAL_CHECK(f.kv_cache_tokens >= 0, "--kv-cache-tokens must not be negative, got ",
               f.kv_cache_tokens);
  LoadedEngineModel m{load_model(path), load_tokenizer(path), nullptr, {}};
  const ModelConfig& c = m.model.config;
  SERVAL_CHECK(f.scheduler.max_model_len >= 0 && f.scheduler.max_model_len <= c.max_position,
               "--max-model-len must be in [1, ", c.max_position, "] (the model's context), got ",
               f.scheduler.max_model_len);
  // The CPU runner keeps K/V in f32, the CUDA one in bf16.
  const int64_t kv_elem_bytes = f.device == "cuda" ? 2 : 4;
  const int64_t bytes_per_token = 2 * c.num_layers * c.kv_dim() * kv_elem_bytes;
  RunnerOptions ro;
  ro.block_size = f.block_size;
  ro.threads = f.threads;
  ro.device = f.device;
  ro.kv_cache_tokens = f.kv_cache_tokens;
  SERVAL_CHECK(f.device != "cuda" || f.kv_cache_memory_fraction == 0,
               "--kv-cache-memory-fraction plans host memory; on --device cuda give --kv-cache-tokens");
  if (f.kv_cache_tokens == 0 && f.kv_cache_memory_fraction != 0) {
    // The runner converts the weights to f32: that, and a small activation
    // reserve, come off the available memory first.
    int64_t params = 0;
    for (const auto& [name, t] : m.model.weights.all()) params += t.numel();
    const int64_t reserve = int64_t(params) * 4 + (int64_t(256) << 20);
    ro.kv_cache_tokens = kv_tokens_for_memory(f.kv_cache_memory_fraction, available_memory_bytes(),
                                              reserve, bytes_per_token, f.block_size);
  }
  m.runner = ModelRunner::create(c, m.model.weights, ro);
  m.plan.num_blocks = m.runner->num_blocks();
  m.plan.block_size = m.runner->block_size();
  m.plan.bytes_per_token = bytes_per_token;
  m.plan.context_len = c.max_position;
  std::fprintf(stderr, "%s\n", m.plan.describe().c_str());
  return m;
}

}  // namespace serval::cli
