#pragma once
// Serval's engine metrics, named after vLLM's (vllm:X -> serval:X, same types,
// help texts and bucket boundaries) so that existing dashboards work after
// replacing the prefix. Registered in a Registry the caller owns (create it
// with the constant label model_name=... as vLLM's dashboards filter on it).
//
// The engine thread fills the three stats structs and records them; the HTTP
// thread calls registry.expose(). Recording takes no lock except a histogram's
// own short one.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/metrics.h"

namespace serval {

// State after a scheduler step (gauges) and the prefix-cache lookups it did.
struct SchedulerStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_total = 0;   // blocks in the pool
  int64_t kv_blocks_used = 0;    // referenced by a running request
  int64_t kv_blocks_cached = 0;  // unreferenced but holding cached prefixes (evictable)
  int64_t kv_blocks_free = 0;    // empty
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up this step
  int64_t prefix_cache_hits = 0;     // of them, tokens found in the cache
};

// What happened during one engine step.
struct IterationStats {
  int64_t num_prompt_tokens = 0;      // prompt tokens computed
  int64_t num_generation_tokens = 0;  // tokens sampled
  int64_t num_preemptions = 0;
  std::vector<double> time_to_first_token_s;  // requests that got their first token
  std::vector<double> inter_token_latency_s;  // per later token: time since the previous one
  std::vector<int64_t> n_params;  // `n` of each request that arrived
  // Per request whose n sequences have all finished: the most tokens any of
  // them generated.
  std::vector<int64_t> max_num_generation_tokens;
};

// A request that finished, with its timeline (seconds).
struct FinishedRequestStats {
  std::string_view finish_reason;  // "stop", "length", "abort", "timeout", "error"
  int64_t num_prompt_tokens = 0;
  int64_t num_generation_tokens = 0;
  double e2e_latency_s = 0;   // arrival -> last token
  double queued_time_s = 0;   // arrival -> first scheduled
  double prefill_time_s = 0;  // first scheduled -> first token
  double decode_time_s = 0;   // first token -> last token
  int64_t max_tokens_param = 0;  // the request's max_tokens; 0 if not given
};

class EngineMetrics {
 public:
  // The finish reasons whose request_success series exist from the start.
  static const std::vector<std::string>& finish_reasons();
  // vLLM's bucket boundaries.
  static const std::vector<double>& ttft_buckets();
  static const std::vector<double>& inter_token_buckets();
  static const std::vector<double>& request_latency_buckets();

  // `max_model_len` bounds the token-count histograms' 1-2-5 buckets. The
  // registry must outlive this object.
  EngineMetrics(metrics::Registry& registry, int64_t max_model_len);

  // serval:cache_config_info, an info gauge (always 1) whose labels describe
  // the KV cache as vLLM's cache_config_info does (string values, Python's
  // "True"/"False"). Set once, at start-up.
  void set_cache_config(int32_t block_size, int64_t num_blocks, bool prefix_caching);

  // Which metrics /metrics also exports under vLLM's name (vllm:X for serval:X).
  enum class VllmNames {
    kGateway,  // the gauges routers read: requests running and waiting, KV usage, cache config
    kAll,      // every metric that has a vLLM equivalent (not the kv_cache_blocks_* gauges)
  };
  static void add_vllm_aliases(metrics::Registry& registry, VllmNames which);

  void record(const SchedulerStats& stats);
  void record(const IterationStats& stats);
  void record(const FinishedRequestStats& stats);

  // All metrics, for code that records directly.
  metrics::Gauge& num_requests_running;
  metrics::Gauge& num_requests_waiting;
  metrics::Gauge& kv_cache_usage_perc;
  metrics::Gauge& kv_cache_blocks_used;
  metrics::Gauge& kv_cache_blocks_free;
  metrics::Gauge& kv_cache_blocks_cached;
  metrics::Counter& prefix_cache_queries_total;
  metrics::Counter& prefix_cache_hits_total;
  metrics::Counter& num_preemptions_total;
  metrics::Counter& prompt_tokens_total;
  metrics::Counter& generation_tokens_total;
  metrics::CounterFamily& request_success_total;  // label finished_reason
  metrics::Histogram& request_prompt_tokens;
  metrics::Histogram& request_generation_tokens;
  metrics::Histogram& iteration_tokens_total;
  metrics::Histogram& request_max_num_generation_tokens;
  metrics::Histogram& request_params_n;
  metrics::Histogram& request_params_max_tokens;
  metrics::Histogram& time_to_first_token_seconds;
  metrics::Histogram& time_per_output_token_seconds;
  metrics::Histogram& inter_token_latency_seconds;
  metrics::Histogram& request_time_per_output_token_seconds;
  metrics::Histogram& e2e_request_latency_seconds;
  metrics::Histogram& request_queue_time_seconds;
  metrics::Histogram& request_inference_time_seconds;
  metrics::Histogram& request_prefill_time_seconds;
  metrics::Histogram& request_decode_time_seconds;
  // Structured output (Serval's own): token masks made, and the host time they took.
  metrics::Counter& structured_output_masks_total;
  metrics::Counter& structured_output_mask_seconds_total;
  // Speculative decoding (vLLM's names): rows that carried a draft, their
  // draft tokens, the accepted ones, and accepted ones per draft position.
  metrics::Counter& spec_decode_num_drafts_total;
  metrics::Counter& spec_decode_num_draft_tokens_total;
  metrics::Counter& spec_decode_num_accepted_tokens_total;
  metrics::CounterFamily& spec_decode_num_accepted_tokens_per_pos_total;  // label position
  // One verified row: `draft` tokens proposed, `accepted` of them kept.
  void record_draft(int32_t draft, int32_t accepted);

 private:
  metrics::Registry& registry_;
  std::vector<metrics::Counter*> success_by_reason_;  // parallel to finish_reasons()
};

}  // namespace serval
