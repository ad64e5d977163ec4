#include "engine/constraints.h"

#include <algorithm>
#include <exception>

#include <omp.h>

#include "core/error.h"
#include "grammar/closing_mask.h"

namespace serval {

void Constraints::add(int64_t id, std::shared_ptr<const grammar::TokenMasker> masker) {
  SERVAL_CHECK(masker != nullptr, "request ", id, ": a constraint needs its grammar");
  requests_[id] = Request{std::move(masker), {}};
}

Constraints::Sample& Constraints::sample_of(const Sequence& seq) {
  Request& r = requests_.at(seq.id());
  std::unique_ptr<Sample>& s = r.samples[seq.sample_index()];
  if (!s) s = std::make_unique<Sample>(r.masker->grammar_ptr());
  return *s;
}

void Constraints::fill_all(std::span<const Job> jobs) {
  std::vector<Sample*>& samples = job_samples_;
  std::vector<std::exception_ptr>& errors = job_errors_;
  samples.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) samples[i] = &sample_of(*jobs[i].seq);
  errors.assign(jobs.size(), nullptr);
  const int n = int(jobs.size());
  // A few threads: a mask is tens of microseconds; more threads than rows or
  // than 8 only add wake-ups.
  const int threads = std::max(1, std::min({n, omp_get_max_threads(), 8}));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (n > 1)
  for (int i = 0; i < n; ++i) {
    try {
      fill_from(*jobs[size_t(i)].seq, *samples[size_t(i)], jobs[size_t(i)].mask);
    } catch (...) {
      errors[size_t(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

void Constraints::fill_from(const Sequence& seq, Sample& s, std::span<uint32_t> mask) const {
  const Request& r = requests_.at(seq.id());
  const std::vector<int32_t>& out = seq.output_ids();
  for (; s.consumed < out.size(); ++s.consumed) {
    const int32_t token = out[s.consumed];
    SERVAL_CHECK(r.masker->accept_token(s.matcher, token), "request ", seq.id(), ": output token ", token,
                 " does not follow its grammar (structured output)");
  }
  SERVAL_CHECK(mask.size() == mask_words(), "a mask of ", mask.size(), " words for ", mask_words());
  const size_t vocab_words = r.masker->vocab().mask_words();
  // The grammar's vocabulary is the tokenizer's: a model's larger embedding
  // leaves the extra ids out; a smaller one cannot hold the tokenizer's ids.
  SERVAL_CHECK(vocab_words <= mask.size(), "the tokenizer's ", r.masker->vocab().size(),
               " tokens do not fit the model's vocabulary of ", vocab_size_);
  std::fill(mask.begin(), mask.end(), 0u);
  // Near max_tokens, only tokens that leave room to finish (grammar/closing_mask.h).
  grammar::fill_budget_mask(*r.masker, s.matcher, seq.stop().max_tokens - int64_t(out.size()),
                            mask.first(vocab_words));
  // Bits past the model's vocabulary in the last word stay 0.
  if (vocab_size_ % 32 != 0) mask.back() &= (1u << (vocab_size_ % 32)) - 1u;
}

}  // namespace serval
