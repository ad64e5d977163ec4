#pragma once
// Sequence: the state of one generation stream inside the engine loop: its
// tokens (prompt, then output), how many of them have K/V in the cache, its
// KV blocks, how it samples and when it stops.
//
// Tokens [0, num_computed_tokens) have been through the model; the rest are
// known but not yet computed (the whole prompt at first, then the one token
// just sampled). Owned by the engine loop thread.
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/block_table.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"
#include "sampling/sampling_params.h"
#include "sched/stop_criteria.h"

namespace serval {

class Sequence {
 public:
  // The Rng is keyed by params.seed, or by a fresh random seed when unset.
  // Throws serval::Error on an empty prompt or negative token ids.
  Sequence(int64_t id, std::vector<int32_t> prompt_ids, SamplingParams params, StopCriteria stop,
           BlockTable block_table);

  int64_t id() const { return id_; }
  // Which of its request's n samples this is (0 for the first). Samples of
  // one request share id().
  int32_t sample_index() const { return sample_index_; }
  // Samples to fork from this one once its prompt is computed: n - 1 for the
  // first sample of a request of n (set_num_samples), 0 once forked.
  int32_t num_pending_forks() const { return pending_forks_; }
  // n >= 1 samples for this request; only before any output. Throws otherwise.
  void set_num_samples(int32_t n);
  // Sample `index` of the same request, from this sequence's state before any
  // output: same prompt, computed tokens and stop criteria, `table` (a
  // KvCacheManager::fork of this one's), its own Rng (params.seed + index when
  // seeded, else a fresh seed), no pending forks. Throws if this has output.
  Sequence fork(int32_t index, BlockTable table) const;
  // Its samples have been forked (num_pending_forks() becomes 0).
  void mark_forked() { pending_forks_ = 0; }
  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  int64_t num_prompt_tokens() const { return int64_t(prompt_ids_.size()); }
  int64_t num_tokens() const { return num_prompt_tokens() + int64_t(output_ids_.size()); }
  // Token at `position` of prompt + output, then of the draft.
  int32_t token_at(int64_t position) const;

  // Speculative decoding: draft tokens proposed after the known ones for
  // the step being planned (Scheduler::DraftFn). They are computed with the
  // last known token and verified after the step; Scheduler::commit keeps the
  // accepted ones as output and drops the draft. Empty outside such a step.
  const std::vector<int32_t>& draft_ids() const { return draft_ids_; }
  std::vector<int32_t>& draft_ids() { return draft_ids_; }
  int64_t num_tokens_with_draft() const { return num_tokens() + int64_t(draft_ids_.size()); }
  // Whether its rows may carry drafts (a request's "speculative": false: no).
  bool speculative() const { return speculative_; }
  void set_speculative(bool on) { speculative_ = on; }

  int64_t num_computed_tokens() const { return num_computed_tokens_; }
  int64_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens_; }
  bool prompt_computed() const { return num_computed_tokens_ >= num_prompt_tokens(); }
  // Its prompt's tokens are scored as they are computed
  // (SamplingParams::prompt_logprobs): the first sample, before any output
  // (after that they were scored, and a recompute need not repeat it).
  bool scores_prompt() const { return params_.prompt_logprobs >= 0 && sample_index_ == 0 && output_ids_.empty(); }
  // Records that n more tokens went through the model. Throws past num_tokens().
  void advance_computed(int64_t n);
  // Forgets all computed K/V (preemption by recompute: the scheduler freed the
  // blocks; every known token, outputs included, goes through the model again).
  void reset_computed() {
    num_computed_tokens_ = 0;
    draft_ids_.clear();
  }

  BlockTable& block_table() { return block_table_; }
  const BlockTable& block_table() const { return block_table_; }
  const SamplingParams& params() const { return params_; }
  const StopCriteria& stop() const { return stop_; }
  Rng& rng() { return rng_; }
  uint64_t seed() const { return rng_.seed(); }

  // Appends a sampled token (and its logprobs, when requested) and applies the
  // stop criteria; returns the finish reason (kNone: keep going).
  FinishReason append_output(int32_t token, std::optional<Logprobs> logprobs,
                             int64_t max_model_len);
  const std::vector<Logprobs>& output_logprobs() const { return output_logprobs_; }

  void abort() { finish_reason_ = FinishReason::kAbort; }
  // Ends the sequence for a reason decided outside the stop criteria
  // (kTimeout, kError, kAbort). Throws on kNone or if already finished.
  void finish(FinishReason reason);
  bool finished() const { return finish_reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_reason_; }
  // The token that triggered a kStop finish (EOS or a stop token).
  std::optional<int32_t> stop_token() const { return stop_token_; }

 private:
  int64_t id_;
  int32_t sample_index_ = 0;
  int32_t pending_forks_ = 0;
  std::vector<int32_t> prompt_ids_;
  std::vector<int32_t> output_ids_;
  std::vector<Logprobs> output_logprobs_;
  std::vector<int32_t> draft_ids_;
  bool speculative_ = true;
  int64_t num_computed_tokens_ = 0;
  BlockTable block_table_;
  SamplingParams params_;
  StopCriteria stop_;
  Rng rng_;
  FinishReason finish_reason_ = FinishReason::kNone;
  std::optional<int32_t> stop_token_;
};

}  // namespace serval
