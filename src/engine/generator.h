#pragma once
// Generator: offline generation for a fixed set of prompts through the real
// engine structure (Sequence + paged KV + BatchBuilder + ModelRunner +
// Sampler). Each step is one forward: first all admitted prompts in one ragged
// batch, then one token per running sequence.
//
// Not the serving scheduler (no chunked prefill, no preemption, no prefix
// cache): a sequence is admitted only when the blocks for its longest possible
// length (prompt + max_tokens, capped by the context) are free, so it can never
// run out of KV mid-way; sequences that do not fit wait until others finish.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "engine/batch_builder.h"
#include "kv/kv_cache_manager.h"
#include "runtime/model_runner.h"
#include "sampling/sampler.h"
#include "sched/sequence.h"

namespace serval {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  StopCriteria stop;
};

// One generated token, reported as soon as it is sampled.
struct TokenEvent {
  int32_t seq_index = 0;                  // index into the requests
  int32_t token = -1;
  const Logprobs* logprobs = nullptr;     // when params.logprobs >= 0
  FinishReason finish = FinishReason::kNone;  // set on the sequence's last token
  // The model's raw logits row the token was sampled from (before penalties
  // and temperature). Valid only during the callback.
  std::span<const float> logits;
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct SequenceOutput {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> token_ids;
  std::vector<Logprobs> logprobs;  // one per token when requested, else empty
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;  // EOS or stop token that ended it
  uint64_t seed = 0;                  // the seed used (drawn when not given)
  double time_to_first_token_s = 0;   // from the start of generate()
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  double prefill_s = 0;     // steps that computed prompt tokens
  double decode_s = 0;      // steps that computed only sampled tokens
  int64_t decode_tokens = 0;  // tokens sampled in decode steps
  double total_s = 0;
  double time_to_first_token_s = 0;  // first token of any sequence

  double decode_tokens_per_s() const { return decode_s > 0 ? decode_tokens / decode_s : 0.0; }
  double prefill_tokens_per_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0.0; }
};

struct GenerationResult {
  std::vector<SequenceOutput> sequences;  // in request order
  GenerationStats stats;
};

class Generator {
 public:
  // The KV cache is sized from runner.num_blocks() and runner.block_size().
  explicit Generator(ModelRunner& runner);

  // Runs all requests to completion. Throws serval::Error on invalid requests
  // (parameters, empty or over-long prompts, token ids outside the vocabulary)
  // before running anything, or if one request alone cannot fit in the KV cache.
  GenerationResult generate(const std::vector<GenerationRequest>& requests,
                            const TokenCallback& on_token = {});

  const KvCacheManager& kv() const { return kv_; }

 private:
  void check_request(const GenerationRequest& request, size_t index) const;
  int64_t blocks_reserved_for(const Sequence& seq) const;
  // Admits and steps sequences until all are finished.
  void run(std::vector<Sequence>& seqs, GenerationResult& result, const TokenCallback& on_token,
           std::chrono::steady_clock::time_point t0);
  // One forward over `running`; returns the number of prompt tokens it computed.
  int64_t step(std::vector<Sequence*>& running, GenerationResult& result,
               const TokenCallback& on_token, std::chrono::steady_clock::time_point t0);

  ModelRunner& runner_;
  KvCacheManager kv_;
  BatchBuilder batch_builder_;
  Sampler sampler_;
  int64_t vocab_size_;
  int64_t max_model_len_;  // 0: unlimited
  Batch batch_;
  std::vector<ScheduledChunk> scheduled_;
  std::vector<float> logits_;
};

}  // namespace serval
