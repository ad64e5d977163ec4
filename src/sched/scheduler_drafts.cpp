// Speculative decoding in the scheduler (scheduler.h): asking the drafter
// for a decode row's draft, and committing a verified row (its accepted
// tokens appended, the rest of the draft rolled back).
#include <algorithm>

#include "core/error.h"
#include "sched/scheduler.h"
#include "sched/scheduler_entry.h"

namespace serval {

void Scheduler::set_drafter(DraftFn drafter, int32_t max_draft) {
  SERVAL_CHECK(max_draft >= 0, "max_draft must not be negative, got ", max_draft);
  drafter_ = std::move(drafter);
  max_draft_ = drafter_ ? max_draft : 0;
}

void Scheduler::propose_draft(Entry* e, int64_t budget) {
  Sequence& seq = e->seq;
  seq.draft_ids().clear();
  // Only a row decoding one token: not a prompt (chunk) nor a recompute.
  if (!drafter_ || !seq.speculative() || seq.output_ids().empty() || seq.num_uncomputed_tokens() != 1) return;
  // The step appends up to d + 1 tokens: within max_tokens and the context.
  int64_t limit = std::min<int64_t>(max_draft_, budget - 1);
  limit = std::min(limit, seq.stop().max_tokens - int64_t(seq.output_ids().size()) - 1);
  if (config_.max_model_len > 0) limit = std::min(limit, config_.max_model_len - seq.num_tokens() - 1);
  // Each draft token takes a logits row: drafts share the rows the runner
  // plans beyond one per sequence with scored prompt tokens.
  limit = std::min(limit, scored_rows_left_);
  if (limit < 1) return;
  drafter_(seq, e->tokens, int32_t(limit));
  SERVAL_CHECK(int64_t(seq.draft_ids().size()) <= limit, "internal error: the drafter proposed ",
               seq.draft_ids().size(), " tokens, at most ", limit, " were asked for");
}

int64_t Scheduler::commit_draft_row(Entry* e, std::span<SampledToken> sampled, int32_t accepted) {
  Sequence& seq = e->seq;
  std::vector<int32_t>& draft = seq.draft_ids();
  SERVAL_CHECK(accepted >= 1 && size_t(accepted) <= sampled.size(), "commit: ", accepted,
               " tokens accepted of a row of ", sampled.size());
  SERVAL_CHECK(seq.num_computed_tokens() + 1 == seq.num_tokens(), "internal error: sequence ", seq.id(),
               " carried a draft with ", seq.num_uncomputed_tokens(), " tokens uncomputed");
  // Every token kept before the last is a draft token the step computed.
  for (int32_t j = 0; j + 1 < accepted; ++j)
    SERVAL_CHECK(sampled[size_t(j)].token == draft[size_t(j)], "commit: sequence ", seq.id(), ": draft token ", j,
                 " (", draft[size_t(j)], ") is accepted but ", sampled[size_t(j)].token, " was sampled there");
  draft.clear();
  int64_t m = 0;
  FinishReason finish = FinishReason::kNone;
  while (m < accepted && finish == FinishReason::kNone) {
    SampledToken& t = sampled[size_t(m++)];
    finish = seq.append_output(t.token, std::move(t.logprobs), config_.max_model_len);
    e->tokens.push_back(t.token);
  }
  // Computed: the last known token and the kept draft tokens, i.e. all but
  // the last token appended. The rejected ones' slots go, then the cache
  // takes full blocks of computed tokens only.
  seq.advance_computed(m);
  kv_.truncate(seq.block_table(), seq.num_computed_tokens());
  kv_computed(seq, std::span<const int32_t>(e->tokens).first(size_t(seq.num_computed_tokens())));
  if (finish != FinishReason::kNone) retire(e);
  return m;
}

}  // namespace serval
