#include "engine/engine_metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "exposition_checker.h"

namespace serval {
namespace {

using metrics::Labels;
using metrics::Registry;
using serval::testing::ParsedFamily;
using serval::testing::parse_exposition;
using serval::testing::sample_value;

const Labels kModel = {{"model_name", "tiny"}};

Labels with_model(Labels extra) {
  Labels labels = kModel;
  labels.insert(labels.end(), extra.begin(), extra.end());
  return labels;
}

std::vector<ParsedFamily> scrape(const Registry& r) {
  std::vector<std::string> errors;
  auto families = parse_exposition(r.expose(), errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  return families;
}

const ParsedFamily* find(const std::vector<ParsedFamily>& families, const std::string& name) {
  for (const ParsedFamily& f : families)
    if (f.name == name) return &f;
  return nullptr;
}

TEST(EngineMetrics, RegistersVllmNamedMetricsWithTheirTypes) {
  Registry r(kModel);
  EngineMetrics m(r, 2048);
  const auto families = scrape(r);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"serval:time_to_first_token_seconds", "histogram"},
      {"serval:time_per_output_token_seconds", "histogram"},
      {"serval:inter_token_latency_seconds", "histogram"},
      {"serval:request_time_per_output_token_seconds", "histogram"},
      {"serval:e2e_request_latency_seconds", "histogram"},
      {"serval:request_queue_time_seconds", "histogram"},
      {"serval:request_inference_time_seconds", "histogram"},
      {"serval:request_prefill_time_seconds", "histogram"},
      {"serval:request_decode_time_seconds", "histogram"},
      {"serval:request_prompt_tokens", "histogram"},
      {"serval:request_generation_tokens", "histogram"},
      {"serval:iteration_tokens_total", "histogram"},
      {"serval:request_max_num_generation_tokens", "histogram"},
      {"serval:request_params_n", "histogram"},
      {"serval:request_params_max_tokens", "histogram"},
      {"serval:num_requests_running", "gauge"},
      {"serval:num_requests_waiting", "gauge"},
      {"serval:kv_cache_usage_perc", "gauge"},
      {"serval:kv_cache_blocks_used", "gauge"},
      {"serval:kv_cache_blocks_free", "gauge"},
      {"serval:kv_cache_blocks_cached", "gauge"},
      {"serval:prefix_cache_queries_total", "counter"},
      {"serval:prefix_cache_hits_total", "counter"},
      {"serval:num_preemptions_total", "counter"},
      {"serval:prompt_tokens_total", "counter"},
      {"serval:generation_tokens_total", "counter"},
      {"serval:request_success_total", "counter"},
      {"serval:structured_output_masks_total", "counter"},
      {"serval:structured_output_mask_seconds_total", "counter"},
      {"serval:spec_decode_num_drafts_total", "counter"},
      {"serval:spec_decode_num_draft_tokens_total", "counter"},
      {"serval:spec_decode_num_accepted_tokens_total", "counter"},
      {"serval:spec_decode_num_accepted_tokens_per_pos_total", "counter"},
  };
  EXPECT_EQ(families.size(), expected.size());
  for (const auto& [name, type] : expected) {
    const ParsedFamily* f = find(families, name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->type, type) << name;
    EXPECT_FALSE(f->help.empty()) << name;
    EXPECT_FALSE(f->samples.empty()) << name << " has no series before the first request";
  }
  // Every finish reason has a series at 0 from the start.
  for (const char* reason : {"abort", "error", "length", "stop", "timeout"})
    EXPECT_EQ(sample_value(families, "serval:request_success_total",
                           with_model({{"finished_reason", reason}})),
              0.0)
        << reason;
}

TEST(EngineMetrics, CacheConfigInfoAndVllmNames) {
  std::vector<std::string> all;  // every family but the Serval-only KV block gauges
  {
    Registry r(kModel);
    EngineMetrics m(r, 2048);
    m.set_cache_config(16, 512, false);
    for (const ParsedFamily& f : scrape(r))
      if (f.name.find("kv_cache_blocks") == std::string::npos && f.name.find("structured_output") == std::string::npos)
        all.push_back("vllm:" + f.name.substr(7));  // Serval's own have no vLLM name
  }
  for (const auto which : {EngineMetrics::VllmNames::kGateway, EngineMetrics::VllmNames::kAll}) {
    Registry r(kModel);
    EngineMetrics m(r, 2048);
    m.set_cache_config(16, 512, false);
    m.kv_cache_usage_perc.set(0.5);
    EngineMetrics::add_vllm_aliases(r, which);
    const auto families = scrape(r);
    std::vector<std::string> vllm;
    for (const ParsedFamily& f : families)
      if (f.name.starts_with("vllm:")) vllm.push_back(f.name);
    std::sort(vllm.begin(), vllm.end());
    std::vector<std::string> want = which == EngineMetrics::VllmNames::kAll
                                        ? all
                                        : std::vector<std::string>{"vllm:cache_config_info", "vllm:kv_cache_usage_perc",
                                                                   "vllm:num_requests_running",
                                                                   "vllm:num_requests_waiting"};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(vllm, want);
    EXPECT_EQ(sample_value(families, "vllm:kv_cache_usage_perc", kModel), 0.5);
    EXPECT_EQ(sample_value(families, "vllm:cache_config_info",
                           with_model({{"block_size", "16"}, {"enable_prefix_caching", "False"},
                                       {"num_gpu_blocks", "512"}})),
              1.0);
  }
}

TEST(EngineMetrics, UsesVllmBucketBoundaries) {
  Registry r;
  EngineMetrics m(r, 2048);
  const auto families = scrape(r);
  auto les = [&](const std::string& name) {
    std::vector<std::string> out;
    for (const auto& s : find(families, name)->samples)
      if (s.name == name + "_bucket") out.push_back(s.labels.back().second);
    return out;
  };
  // vLLM v1 loggers.py: TTFT, inter-token and request-latency buckets, and
  // build_1_2_5_buckets(max_model_len) for token counts.
  EXPECT_EQ(les("serval:time_to_first_token_seconds"),
            (std::vector<std::string>{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1",
                                      "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0",
                                      "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"}));
  EXPECT_EQ(les("serval:inter_token_latency_seconds"),
            (std::vector<std::string>{"0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3",
                                      "0.4", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0",
                                      "20.0", "40.0", "80.0", "+Inf"}));
  EXPECT_EQ(les("serval:time_per_output_token_seconds"), les("serval:inter_token_latency_seconds"));
  EXPECT_EQ(les("serval:e2e_request_latency_seconds"),
            (std::vector<std::string>{"0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0",
                                      "10.0", "15.0", "20.0", "30.0", "40.0", "50.0", "60.0",
                                      "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf"}));
  EXPECT_EQ(les("serval:request_queue_time_seconds"), les("serval:e2e_request_latency_seconds"));
  EXPECT_EQ(les("serval:request_prompt_tokens"),
            (std::vector<std::string>{"1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0",
                                      "500.0", "1000.0", "2000.0", "+Inf"}));
}

TEST(EngineMetrics, RecordsSchedulerIterationAndFinishedStats) {
  Registry r(kModel);
  EngineMetrics m(r, 4096);

  SchedulerStats sched;
  sched.num_running = 3;
  sched.num_waiting = 5;
  sched.kv_blocks_total = 64;
  sched.kv_blocks_used = 16;
  sched.kv_blocks_cached = 8;
  sched.kv_blocks_free = 40;
  sched.prefix_cache_queries = 512;
  sched.prefix_cache_hits = 496;
  m.record(sched);
  sched.prefix_cache_queries = 10;
  sched.prefix_cache_hits = 0;
  m.record(sched);  // counters accumulate, gauges are replaced

  IterationStats it;
  it.num_prompt_tokens = 100;
  it.num_generation_tokens = 3;
  it.num_preemptions = 1;
  it.time_to_first_token_s = {0.03, 0.3};
  it.inter_token_latency_s = {0.02, 0.02, 0.5};
  it.n_params = {1, 4};
  it.max_num_generation_tokens = {5};
  m.record(it);

  FinishedRequestStats done;
  done.finish_reason = "stop";
  done.num_prompt_tokens = 7;
  done.num_generation_tokens = 5;
  done.e2e_latency_s = 2.0;
  done.queued_time_s = 0.25;
  done.prefill_time_s = 0.5;
  done.decode_time_s = 1.0;
  done.max_tokens_param = 16;
  m.record(done);
  done.max_tokens_param = 0;  // not given: not observed
  done.finish_reason = "cancelled_by_moon";  // an unknown reason still counts
  done.num_generation_tokens = 1;
  m.record(done);

  const auto f = scrape(r);
  auto v = [&](const std::string& name, Labels extra = {}) {
    return sample_value(f, name, with_model(std::move(extra)));
  };
  EXPECT_EQ(v("serval:num_requests_running"), 3);
  EXPECT_EQ(v("serval:num_requests_waiting"), 5);
  EXPECT_EQ(v("serval:kv_cache_usage_perc"), 0.25);
  EXPECT_EQ(v("serval:kv_cache_blocks_used"), 16);
  EXPECT_EQ(v("serval:kv_cache_blocks_cached"), 8);
  EXPECT_EQ(v("serval:kv_cache_blocks_free"), 40);
  EXPECT_EQ(v("serval:prefix_cache_queries_total"), 522);
  EXPECT_EQ(v("serval:prefix_cache_hits_total"), 496);
  EXPECT_EQ(v("serval:prompt_tokens_total"), 100);
  EXPECT_EQ(v("serval:generation_tokens_total"), 3);
  EXPECT_EQ(v("serval:num_preemptions_total"), 1);

  EXPECT_EQ(v("serval:time_to_first_token_seconds_count"), 2);
  EXPECT_EQ(v("serval:time_to_first_token_seconds_bucket", {{"le", "0.04"}}), 1);
  EXPECT_EQ(v("serval:time_to_first_token_seconds_bucket", {{"le", "0.25"}}), 1);
  EXPECT_EQ(v("serval:time_to_first_token_seconds_bucket", {{"le", "0.5"}}), 2);
  EXPECT_EQ(v("serval:inter_token_latency_seconds_count"), 3);
  EXPECT_EQ(v("serval:inter_token_latency_seconds_bucket", {{"le", "0.025"}}), 2);
  EXPECT_EQ(v("serval:time_per_output_token_seconds_count"), 3);
  EXPECT_DOUBLE_EQ(v("serval:inter_token_latency_seconds_sum"), 0.54);

  EXPECT_EQ(v("serval:request_success_total", {{"finished_reason", "stop"}}), 1);
  EXPECT_EQ(v("serval:request_success_total", {{"finished_reason", "length"}}), 0);
  EXPECT_EQ(v("serval:request_success_total", {{"finished_reason", "cancelled_by_moon"}}), 1);
  EXPECT_EQ(v("serval:e2e_request_latency_seconds_count"), 2);
  EXPECT_EQ(v("serval:e2e_request_latency_seconds_bucket", {{"le", "1.5"}}), 0);
  EXPECT_EQ(v("serval:e2e_request_latency_seconds_bucket", {{"le", "2.0"}}), 2);
  EXPECT_EQ(v("serval:request_queue_time_seconds_sum"), 0.5);
  EXPECT_EQ(v("serval:request_prefill_time_seconds_sum"), 1.0);
  EXPECT_EQ(v("serval:request_decode_time_seconds_sum"), 2.0);
  EXPECT_EQ(v("serval:request_inference_time_seconds_sum"), 3.0);
  EXPECT_EQ(v("serval:request_prompt_tokens_bucket", {{"le", "5.0"}}), 0);
  EXPECT_EQ(v("serval:request_prompt_tokens_bucket", {{"le", "10.0"}}), 2);
  EXPECT_EQ(v("serval:request_generation_tokens_bucket", {{"le", "1.0"}}), 1);
  EXPECT_EQ(v("serval:request_generation_tokens_sum"), 6);
  EXPECT_EQ(v("serval:iteration_tokens_total_count"), 1);
  EXPECT_EQ(v("serval:iteration_tokens_total_bucket", {{"le", "64.0"}}), 0);
  EXPECT_EQ(v("serval:iteration_tokens_total_bucket", {{"le", "128.0"}}), 1);
  EXPECT_EQ(v("serval:request_params_n_bucket", {{"le", "2.0"}}), 1);
  EXPECT_EQ(v("serval:request_params_n_bucket", {{"le", "5.0"}}), 2);
  EXPECT_EQ(v("serval:request_max_num_generation_tokens_sum"), 5);
  EXPECT_EQ(v("serval:request_params_max_tokens_count"), 1);
  EXPECT_EQ(v("serval:request_params_max_tokens_bucket", {{"le", "20.0"}}), 1);
  // decode 1.0 s over 4 tokens after the first; the one-token request adds none.
  EXPECT_EQ(v("serval:request_time_per_output_token_seconds_count"), 1);
  EXPECT_EQ(v("serval:request_time_per_output_token_seconds_sum"), 0.25);
}

TEST(EngineMetrics, EmptyPoolGivesZeroUsage) {
  Registry r;
  EngineMetrics m(r, 16);
  m.record(SchedulerStats{});
  EXPECT_EQ(m.kv_cache_usage_perc.value(), 0.0);
}

}  // namespace
}  // namespace serval
