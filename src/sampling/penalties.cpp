#include "sampling/penalties.h"

#include "core/error.h"

namespace serval {

void PenaltyApplier::apply(std::span<float> logits, const SamplingParams& params,
                           std::span<const int32_t> prompt_ids,
                           std::span<const int32_t> output_ids) {
  if (!params.has_penalties()) return;
  const size_t vocab = logits.size();
  if (output_count_.size() != vocab) {
    output_count_.assign(vocab, 0);
    seen_.assign(vocab, 0);
  }
  auto check = [vocab](int32_t id, const char* where) {
    SERVAL_CHECK(id >= 0 && size_t(id) < vocab, "token id ", id, " in the ", where,
                 " is outside the vocabulary [0, ", vocab, ")");
  };
  // Check every id before marking any, so a bad id leaves the scratch clean.
  for (int32_t id : prompt_ids) check(id, "prompt");
  for (int32_t id : output_ids) check(id, "output");
  touched_.clear();
  for (int32_t id : prompt_ids) {
    if (!seen_[id]) { seen_[id] = 1; touched_.push_back(id); }
  }
  for (int32_t id : output_ids) {
    if (!seen_[id]) { seen_[id] = 1; touched_.push_back(id); }
    ++output_count_[id];
  }

  const float rep = params.repetition_penalty;
  const float freq = params.frequency_penalty;
  const float pres = params.presence_penalty;
  for (int32_t id : touched_) {
    float x = logits[id];
    if (rep != 1.0f) x = x > 0.0f ? x / rep : x * rep;
    const int32_t count = output_count_[id];
    if (count > 0) {
      x -= freq * float(count);
      x -= pres;
    }
    logits[id] = x;
    seen_[id] = 0;
    output_count_[id] = 0;
  }
}

}  // namespace serval
