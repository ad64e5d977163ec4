#include "sched/sequence.h"

#include "core/error.h"

namespace serval {

Sequence::Sequence(int64_t id, std::vector<int32_t> prompt_ids, SamplingParams params,
                   StopCriteria stop, BlockTable block_table)
    : id_(id),
      prompt_ids_(std::move(prompt_ids)),
      block_table_(std::move(block_table)),
      params_(params),
      stop_(std::move(stop)),
      rng_(params.seed ? *params.seed : random_seed()) {
  SERVAL_CHECK(!prompt_ids_.empty(), "sequence ", id_, ": the prompt is empty (no tokens)");
  for (int32_t t : prompt_ids_)
    SERVAL_CHECK(t >= 0, "sequence ", id_, ": prompt token id ", t, " is negative");
}

void Sequence::set_num_samples(int32_t n) {
  SERVAL_CHECK(n >= 1, "n (samples per request) must be at least 1, got ", n);
  SERVAL_CHECK(output_ids_.empty() && sample_index_ == 0, "sequence ", id_,
               ": the number of samples is set before generation, on the first sample");
  pending_forks_ = n - 1;
}

Sequence Sequence::fork(int32_t index, BlockTable table) const {
  SERVAL_CHECK(output_ids_.empty() && !finished(), "sequence ", id_,
               ": only an unfinished sequence without output can fork");
  SamplingParams params = params_;
  if (params.seed) params.seed = *params.seed + uint64_t(index);
  Sequence child(id_, prompt_ids_, params, stop_, std::move(table));
  child.sample_index_ = index;
  child.num_computed_tokens_ = num_computed_tokens_;
  child.speculative_ = speculative_;
  return child;
}

int32_t Sequence::token_at(int64_t position) const {
  SERVAL_CHECK(position >= 0 && position < num_tokens_with_draft(), "sequence ", id_, ": position ",
               position, " is outside its ", num_tokens(), " tokens and ", draft_ids_.size(), " draft tokens");
  if (position < num_prompt_tokens()) return prompt_ids_[position];
  if (position < num_tokens()) return output_ids_[position - num_prompt_tokens()];
  return draft_ids_[position - num_tokens()];
}

void Sequence::advance_computed(int64_t n) {
  SERVAL_CHECK(n >= 0 && num_computed_tokens_ + n <= num_tokens(), "sequence ", id_,
               ": cannot mark ", n, " more tokens computed (", num_computed_tokens_, " of ",
               num_tokens(), " are)");
  num_computed_tokens_ += n;
}

void Sequence::finish(FinishReason reason) {
  SERVAL_CHECK(reason != FinishReason::kNone, "sequence ", id_, ": finish needs a reason");
  SERVAL_CHECK(!finished(), "sequence ", id_, " is already finished (",
               finish_reason_name(finish_reason_), ")");
  finish_reason_ = reason;
}

FinishReason Sequence::append_output(int32_t token, std::optional<Logprobs> logprobs,
                                     int64_t max_model_len) {
  SERVAL_CHECK(!finished(), "sequence ", id_, " is finished; cannot append token ", token);
  output_ids_.push_back(token);
  if (logprobs) output_logprobs_.push_back(std::move(*logprobs));
  finish_reason_ = stop_.check(token, int64_t(output_ids_.size()), num_tokens(), max_model_len);
  if (finish_reason_ == FinishReason::kStop) stop_token_ = token;
  return finish_reason_;
}

}  // namespace serval
