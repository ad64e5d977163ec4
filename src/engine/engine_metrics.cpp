#include "engine/engine_metrics.h"

#include <algorithm>

#include "core/error.h"
#include "spec/proposer.h"

namespace serval {

using metrics::Registry;

const std::vector<std::string>& EngineMetrics::finish_reasons() {
  static const std::vector<std::string> reasons = {"abort", "error", "length", "stop", "timeout"};
  return reasons;
}

const std::vector<double>& EngineMetrics::ttft_buckets() {
  static const std::vector<double> buckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                              0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                              20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return buckets;
}

const std::vector<double>& EngineMetrics::inter_token_buckets() {
  static const std::vector<double> buckets = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
                                              0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,
                                              7.5,  10.0,  20.0, 40.0,  80.0};
  return buckets;
}

const std::vector<double>& EngineMetrics::request_latency_buckets() {
  static const std::vector<double> buckets = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,
                                              5.0,  10.0, 15.0, 20.0,  30.0,  40.0,  50.0,
                                              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return buckets;
}

EngineMetrics::EngineMetrics(Registry& r, int64_t max_model_len)
    : num_requests_running(r.gauge("serval:num_requests_running",
                                   "Number of requests in model execution batches.")),
      num_requests_waiting(r.gauge("serval:num_requests_waiting",
                                   "Number of requests waiting to be processed.")),
      kv_cache_usage_perc(r.gauge("serval:kv_cache_usage_perc",
                                  "KV-cache usage. 1 means 100 percent usage.")),
      kv_cache_blocks_used(r.gauge("serval:kv_cache_blocks_used",
                                   "KV-cache blocks referenced by requests.")),
      kv_cache_blocks_free(r.gauge("serval:kv_cache_blocks_free", "Empty KV-cache blocks.")),
      kv_cache_blocks_cached(r.gauge(
          "serval:kv_cache_blocks_cached",
          "KV-cache blocks not referenced by any request that hold cached prefixes (evictable).")),
      prefix_cache_queries_total(r.counter(
          "serval:prefix_cache_queries_total",
          "Prefix cache queries, in terms of number of queried tokens.")),
      prefix_cache_hits_total(r.counter("serval:prefix_cache_hits_total",
                                        "Prefix cache hits, in terms of number of cached tokens.")),
      num_preemptions_total(r.counter("serval:num_preemptions_total",
                                      "Cumulative number of preemption from the engine.")),
      prompt_tokens_total(
          r.counter("serval:prompt_tokens_total", "Number of prefill tokens processed.")),
      generation_tokens_total(
          r.counter("serval:generation_tokens_total", "Number of generation tokens processed.")),
      request_success_total(r.counter_family("serval:request_success_total",
                                             "Count of successfully processed requests.",
                                             {"finished_reason"})),
      request_prompt_tokens(r.histogram("serval:request_prompt_tokens",
                                        "Number of prefill tokens processed.",
                                        metrics::buckets_1_2_5(static_cast<double>(max_model_len)))),
      request_generation_tokens(
          r.histogram("serval:request_generation_tokens", "Number of generation tokens processed.",
                      metrics::buckets_1_2_5(static_cast<double>(max_model_len)))),
      iteration_tokens_total(r.histogram(
          "serval:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
          {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384})),
      request_max_num_generation_tokens(
          r.histogram("serval:request_max_num_generation_tokens",
                      "Histogram of maximum number of requested generation tokens.",
                      metrics::buckets_1_2_5(static_cast<double>(max_model_len)))),
      request_params_n(r.histogram("serval:request_params_n",
                                   "Histogram of the n request parameter.", {1, 2, 5, 10, 20})),
      request_params_max_tokens(
          r.histogram("serval:request_params_max_tokens",
                      "Histogram of the max_tokens request parameter.",
                      metrics::buckets_1_2_5(static_cast<double>(max_model_len)))),
      time_to_first_token_seconds(r.histogram("serval:time_to_first_token_seconds",
                                              "Histogram of time to first token in seconds.",
                                              ttft_buckets())),
      time_per_output_token_seconds(r.histogram(
          "serval:time_per_output_token_seconds",
          "Histogram of time per output token in seconds (same as inter_token_latency_seconds).",
          inter_token_buckets())),
      inter_token_latency_seconds(r.histogram("serval:inter_token_latency_seconds",
                                              "Histogram of inter-token latency in seconds.",
                                              inter_token_buckets())),
      request_time_per_output_token_seconds(r.histogram(
          "serval:request_time_per_output_token_seconds",
          "Histogram of time_per_output_token_seconds per request.", inter_token_buckets())),
      e2e_request_latency_seconds(r.histogram("serval:e2e_request_latency_seconds",
                                              "Histogram of e2e request latency in seconds.",
                                              request_latency_buckets())),
      request_queue_time_seconds(r.histogram(
          "serval:request_queue_time_seconds",
          "Histogram of time spent in WAITING phase for request.", request_latency_buckets())),
      request_inference_time_seconds(r.histogram(
          "serval:request_inference_time_seconds",
          "Histogram of time spent in RUNNING phase for request.", request_latency_buckets())),
      request_prefill_time_seconds(r.histogram(
          "serval:request_prefill_time_seconds",
          "Histogram of time spent in PREFILL phase for request.", request_latency_buckets())),
      request_decode_time_seconds(r.histogram(
          "serval:request_decode_time_seconds",
          "Histogram of time spent in DECODE phase for request.", request_latency_buckets())),
      structured_output_masks_total(r.counter("serval:structured_output_masks_total",
                                              "Allowed-token masks computed for constrained samples.")),
      structured_output_mask_seconds_total(r.counter("serval:structured_output_mask_seconds_total",
                                                     "Host time spent computing allowed-token masks.")),
      spec_decode_num_drafts_total(r.counter("serval:spec_decode_num_drafts_total", "Number of spec decoding drafts.")),
      spec_decode_num_draft_tokens_total(
          r.counter("serval:spec_decode_num_draft_tokens_total", "Number of draft tokens.")),
      spec_decode_num_accepted_tokens_total(
          r.counter("serval:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.")),
      spec_decode_num_accepted_tokens_per_pos_total(
          r.counter_family("serval:spec_decode_num_accepted_tokens_per_pos_total",
                           "Accepted tokens per draft position.", {"position"})),
      registry_(r) {
  // Series for every finish reason exist from the start (at 0), as in vLLM,
  // so rate() works from the first scrape.
  for (const std::string& reason : finish_reasons())
    success_by_reason_.push_back(&request_success_total.labels({reason}));
  for (int32_t pos = 0; pos < SpeculativeConfig::kMaxTokens; ++pos)
    spec_decode_num_accepted_tokens_per_pos_total.labels({std::to_string(pos)});
}

void EngineMetrics::record_draft(int32_t draft, int32_t accepted) {
  spec_decode_num_drafts_total.inc();
  spec_decode_num_draft_tokens_total.inc(double(draft));
  spec_decode_num_accepted_tokens_total.inc(double(accepted));
  for (int32_t pos = 0; pos < accepted; ++pos)
    spec_decode_num_accepted_tokens_per_pos_total.labels({std::to_string(pos)}).inc();
}

void EngineMetrics::set_cache_config(int32_t block_size, int64_t num_blocks, bool prefix_caching) {
  registry_
      .gauge_family("serval:cache_config_info", "Information of the LLMEngine CacheConfig",
                    {"block_size", "enable_prefix_caching", "num_gpu_blocks"})
      .labels({std::to_string(block_size), prefix_caching ? "True" : "False", std::to_string(num_blocks)})
      .set(1.0);
}

void EngineMetrics::add_vllm_aliases(Registry& registry, VllmNames which) {
  static const char* const gateway[] = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                                        "cache_config_info"};
  static const char* const others[] = {
      "prefix_cache_queries_total", "prefix_cache_hits_total", "num_preemptions_total",
      "prompt_tokens_total", "generation_tokens_total", "request_success_total",
      "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
      "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
      "time_to_first_token_seconds", "time_per_output_token_seconds", "inter_token_latency_seconds",
      "request_time_per_output_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
      "request_inference_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
      "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
      "spec_decode_num_accepted_tokens_per_pos_total"};
  auto alias = [&registry](const char* name) {
    registry.add_alias(std::string("serval:") + name, std::string("vllm:") + name);
  };
  for (const char* name : gateway) alias(name);
  if (which == VllmNames::kAll)
    for (const char* name : others) alias(name);
}

void EngineMetrics::record(const SchedulerStats& s) {
  num_requests_running.set(static_cast<double>(s.num_running));
  num_requests_waiting.set(static_cast<double>(s.num_waiting));
  kv_cache_usage_perc.set(s.kv_blocks_total > 0
                              ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total
                              : 0.0);
  kv_cache_blocks_used.set(static_cast<double>(s.kv_blocks_used));
  kv_cache_blocks_free.set(static_cast<double>(s.kv_blocks_free));
  kv_cache_blocks_cached.set(static_cast<double>(s.kv_blocks_cached));
  prefix_cache_queries_total.inc(static_cast<double>(s.prefix_cache_queries));
  prefix_cache_hits_total.inc(static_cast<double>(s.prefix_cache_hits));
}

void EngineMetrics::record(const IterationStats& s) {
  prompt_tokens_total.inc(static_cast<double>(s.num_prompt_tokens));
  generation_tokens_total.inc(static_cast<double>(s.num_generation_tokens));
  num_preemptions_total.inc(static_cast<double>(s.num_preemptions));
  iteration_tokens_total.observe(static_cast<double>(s.num_prompt_tokens + s.num_generation_tokens));
  for (int64_t n : s.n_params) request_params_n.observe(static_cast<double>(n));
  for (int64_t t : s.max_num_generation_tokens)
    request_max_num_generation_tokens.observe(static_cast<double>(t));
  for (double t : s.time_to_first_token_s) time_to_first_token_seconds.observe(t);
  for (double t : s.inter_token_latency_s) {
    inter_token_latency_seconds.observe(t);
    time_per_output_token_seconds.observe(t);
  }
}

void EngineMetrics::record(const FinishedRequestStats& s) {
  const auto& reasons = finish_reasons();
  const auto it = std::find(reasons.begin(), reasons.end(), s.finish_reason);
  if (it != reasons.end())
    success_by_reason_[it - reasons.begin()]->inc();
  else  // a reason added later: its series appears on first use
    request_success_total.labels({std::string(s.finish_reason)}).inc();
  request_prompt_tokens.observe(static_cast<double>(s.num_prompt_tokens));
  request_generation_tokens.observe(static_cast<double>(s.num_generation_tokens));
  if (s.max_tokens_param > 0)
    request_params_max_tokens.observe(static_cast<double>(s.max_tokens_param));
  e2e_request_latency_seconds.observe(s.e2e_latency_s);
  request_queue_time_seconds.observe(s.queued_time_s);
  request_inference_time_seconds.observe(s.prefill_time_s + s.decode_time_s);
  request_prefill_time_seconds.observe(s.prefill_time_s);
  request_decode_time_seconds.observe(s.decode_time_s);
  // Mean time per output token after the first, as vLLM; undefined for one token.
  if (s.num_generation_tokens > 1)
    request_time_per_output_token_seconds.observe(s.decode_time_s /
                                                  static_cast<double>(s.num_generation_tokens - 1));
}

}  // namespace serval
